"""``sampan simulate``: run fleet's real code for one rank of a layout far larger than this machine.

One rank ``r`` of ``N`` joins torch's *fake* process group (``init_process_group("fake")``: every
collective returns at once, nothing is sent), builds the model under ``FakeTensorMode`` (tensors
carry shape, dtype and device but no storage, so a 405B model costs no memory), and then does what
a training script does: ``Fleet().init`` (the same ``DeviceMesh``), ``fleet.distributed_model``
(tensor parallel, pipeline stage, recompute, FSDP2 sharding), ``fleet.distributed_optimizer``
(hybrid global-norm clipping) and one step: forward and backward over the micro-batches, clip,
AdamW step. What it measures on that rank:

* parameter, gradient and optimizer-state bytes, from the local shards the rank really holds
  (``DTensor.to_local()`` sizes, the torch optimizer's state tensors);
* the step's peak memory (:class:`CountingFakeMode` counts every fake storage from its creation
  until it is freed; torch's ``MemTracker`` refuses a module called once per micro-batch, "multiple
  iterative calls", which every pipeline and accumulation step does);
* every collective issued, with its bytes (``CommCounter``).

What the fake backend cannot do, and what is done instead (each said in the report's ``notes``):

* **Data-dependent Python decisions.** Code that reads a tensor's value (``float(norm)`` in
  clipping, ``if not count > 0``, the pipeline's warm-up vote) cannot run on fake tensors. A
  dispatch mode answers every such read of a fake tensor with 1 (so clipping always scales, which
  is the branch that touches memory, and the pipeline votes for static shapes). Ops whose inputs
  are all real tensors (the ``DeviceMesh``'s rank tables) run for real.
* **Pipeline metadata over P2P.** ``torch.distributed.pipelining`` sends each stage's input
  shapes to the next stage with ``send_object_list``; over the fake group nothing arrives. The
  simulation gives each stage its boundary shapes up front (the static mode ``PipelineStage``
  has for ``input_args`` / ``output_args``), found by running the stage's own forward once on a
  fake input of the boundary shape ``(micro_batch, seq, hidden)``. The schedule's send / recv then
  run through the fake group (they return at once, the receive buffers hold no data), so the
  real 1F1B / GPipe / interleaved order, and its micro-batches in flight, is what is measured.
* **Fewer micro-batches.** A schedule's peak is reached once its warm-up is over and a forward
  runs beside the gradients the first backward left, so by default a pipeline runs ``min(m, pp + 1)``
  micro-batches (1F1B; ``2 pp`` interleaved; GPipe all of them) and pure data / tensor parallelism
  2 when it has several (gradients then accumulate unsharded, as with any ``m > 1``). What grows
  with ``m`` anyway is handled exactly: ``torch.distributed.pipelining`` allocates a receive buffer
  per micro-batch up front (those of the micro-batches not run are added, sized as torch sizes
  them). The collectives are those of the micro-batches run. ``num_micro=`` runs them all.

Memory under ``FakeTensorMode`` is counted on a fake CPU device, with CPU autocast (bf16) standing
in for CUDA autocast; there is no CUDA context, NCCL buffer or allocator fragmentation in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from sampan.distributed.comm_counter import CommCounter
from sampan.distributed.context_parallel import rank_positions
from sampan.distributed.strategy import DistributedStrategy
from sampan.distributed.topology import AXES
from sampan.nn.moe_planned import planned_routing
from sampan.nn.recompute import offload_host


class _FakeFront(TorchDispatchMode):
    """Sits above ``FakeTensorMode``: runs ops on real tensors for real (the mesh's rank tables) and
    answers a read of a fake tensor's value (``.item()``, ``float()``, ``bool()``) with 1."""

    def __init__(self) -> None:
        super().__init__()
        self.scalar_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if tensors and not any(isinstance(t, FakeTensor) for t in tensors):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:
            self.scalar_reads += 1
            dtype = args[0].dtype
            return True if dtype == torch.bool else (1.0 if dtype.is_floating_point else 1)
        return func(*args, **kwargs)


class CountingFakeMode(FakeTensorMode):
    """``FakeTensorMode`` that counts the bytes of the fake storages alive, and their peak.

    Every fake tensor is made here (a factory call, an op on fake tensors, a DTensor's local op),
    so overriding ``dispatch`` sees them all; a storage counts from its creation until it is freed
    (a weak reference's finalizer), views share their base's storage. FSDP2 frees and refills its
    unsharded parameters by resizing their storage (``storage.resize_(0)``), not through an op, so
    ``counting()`` also follows ``UntypedStorage.resize_`` of the storages it knows.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.live = 0
        self.peak = 0
        self._bytes: dict[int, int] = {}
        self._labels: dict[int, tuple[str, str, tuple[int, ...]]] = {}
        self._snapshot_at = 0
        self._paused = 0
        self.at_peak: dict[tuple[str, str, tuple[int, ...]], list[int]] = {}
        """What was alive at the peak (to within 0.5%), by the op that made it, dtype and shape:
        ``[count, bytes]``; see :meth:`breakdown`."""

    def reset_peak(self) -> None:
        self.peak = self.live
        self._snapshot_at = 0

    def _set(self, key: int, nbytes: int) -> None:
        self.live += nbytes - self._bytes.get(key, 0)
        self._bytes[key] = nbytes
        if self.live > self.peak:
            self.peak = self.live
            # A snapshot costs a pass over the live storages, so take one only when the peak has
            # grown by 0.5% since the last: the last one is within 0.5% of the peak.
            if self.live > self._snapshot_at:
                self._snapshot()
                self._snapshot_at = self.live * 1.005

    def _snapshot(self) -> None:
        groups: dict[tuple[str, str, tuple[int, ...]], list[int]] = {}
        for key, nbytes in self._bytes.items():
            if nbytes:
                entry = groups.setdefault(self._labels.get(key, ("?", "?", ())), [0, 0])
                entry[0] += 1
                entry[1] += nbytes
        self.at_peak = groups

    def breakdown(self, top: int = 12) -> list[dict[str, Any]]:
        """The largest groups of storages alive at the peak: op, dtype, shape, count, bytes."""
        rows = sorted(self.at_peak.items(), key=lambda kv: -kv[1][1])[:top]
        return [{"op": op, "dtype": dtype, "shape": list(shape), "count": count, "bytes": nbytes}
                for (op, dtype, shape), (count, nbytes) in rows]

    def _free(self, key: int) -> None:
        self.live -= self._bytes.pop(key, 0)
        self._labels.pop(key, None)

    def dispatch(self, func, types, args=(), kwargs=None):
        out = super().dispatch(func, types, args, kwargs if kwargs is not None else {})
        if self._paused:
            return out
        if func is torch.ops._c10d_functional.wait_tensor.default and isinstance(args[0], FakeTensor):
            # On a device wait_tensor returns its input; the fake kernel makes a new storage. Count
            # the buffer once: as the output from here on (the input is dropped once waited on).
            key = id(args[0].untyped_storage())
            if key in self._bytes:
                self._set(key, 0)
        for t in tree_leaves(out):
            if isinstance(t, FakeTensor) and t.device.type != "meta":  # meta: offloaded to the host
                storage = t.untyped_storage()
                key = id(storage)
                if key not in self._bytes:
                    self._labels[key] = (str(func.overloadpacket.__name__), str(t.dtype).removeprefix("torch."),
                                         tuple(t.shape))
                    self._set(key, storage.nbytes())
                    weakref.finalize(storage, self._free, key)
        return out

    @contextlib.contextmanager
    def counting(self) -> Iterator[CountingFakeMode]:
        """This mode, with storage resizes followed, and DTensor's shape inference left uncounted.

        DTensor infers an op's output metadata by running it on fake tensors of the *global*
        shapes, in the fake mode it finds active: here that is this one, whose count would then
        include a whole-vocabulary logits gradient the rank never holds. On a GPU that inference
        runs on fake tensors that allocate nothing, so it allocates nothing here either.
        """
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        original_resize = torch.UntypedStorage.resize_
        original_meta = ShardingPropagator._propagate_tensor_meta_non_cached
        mode = self

        def resize_(storage, size):
            result = original_resize(storage, size)
            if id(storage) in mode._bytes:
                mode._set(id(storage), storage.nbytes())
            return result

        def propagate_tensor_meta(propagator, op_schema):
            mode._paused += 1
            try:
                return original_meta(propagator, op_schema)
            finally:
                mode._paused -= 1

        torch.UntypedStorage.resize_ = resize_
        ShardingPropagator._propagate_tensor_meta_non_cached = propagate_tensor_meta
        try:
            with self:
                yield self
        finally:
            torch.UntypedStorage.resize_ = original_resize
            ShardingPropagator._propagate_tensor_meta_non_cached = original_meta


def local_bytes(t: torch.Tensor | None) -> int:
    """Bytes of the part of ``t`` this rank holds (a DTensor's local shard)."""
    if t is None:
        return 0
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


@dataclasses.dataclass
class RankResult:
    """What one simulated rank holds and sends."""

    rank: int
    coords: dict[str, int]
    stages: list[int]
    params: int
    grads: int
    optimizer: int
    peak: dict[str, int]
    """Bytes alive at the step's peak: ``total`` (steady state: the larger of forward-backward's peak
    plus the optimizer state a second step would already hold, and the optimizer step's own peak),
    ``forward_backward``, ``optimizer_step``, and ``at_start`` (alive before the step: the local
    parameters and buffers)."""
    collectives: dict[str, dict[str, float]]
    num_micro: int
    seconds: float
    notes: list[str] = dataclasses.field(default_factory=list)
    peak_breakdown: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The largest groups of what was alive at forward-backward's peak (:meth:`CountingFakeMode.breakdown`)."""

    @property
    def peak_total(self) -> int:
        return self.peak.get("total", 0)

    @property
    def peak_other(self) -> int:
        """The peak less the sharded model state: activations and working copies (what the planner
        calls activations + buffers)."""
        return self.peak_total - self.params - self.grads - self.optimizer

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(peak_total=self.peak_total, peak_other=self.peak_other)
        return out


def rank_of(degrees: dict[str, int], coords: dict[str, int]) -> int:
    """The global rank at ``coords`` of the ``pp x dp x sharding x mp`` mesh (row-major)."""
    rank = 0
    for axis in AXES:
        rank = rank * degrees[axis] + coords.get(axis, 0)
    return rank


def default_num_micro(strategy: DistributedStrategy, degrees: dict[str, int], pp_rank: int = 0) -> int:
    """Micro-batches enough to reach the schedule's peak (see the module doc): its warm-up, then one
    forward after the first backward, when the accumulated gradients exist beside the most activations
    in flight (1F1B: ``pp + 1``; interleaved: ``2 pp``, whose warm-up is shorter than that; GPipe:
    all, since every forward precedes every backward)."""
    pipe = strategy.pipeline_configs
    m = pipe.accumulate_steps
    if degrees["pp"] == 1:
        return min(m, 2)
    if pipe.schedule_mode == "GPipe":
        return m
    if pipe.schedule_mode == "Interleaved1F1B":
        return min(m, 2 * degrees["pp"])
    return min(m, degrees["pp"] + 1)


@contextlib.contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    """This process as rank ``rank`` of a fake group of ``world_size`` (no other process exists)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group is already running in this process; simulate in a fresh one")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _boundary_meta(runner, micro_batch: int, seq_len: int, boundary: tuple[int, int, torch.dtype], amp: bool) -> None:
    """Give each ``PipelineStage`` its input / output shapes (static mode) instead of receiving them.

    ``boundary``: the tokens and width of what crosses a stage boundary, and its dtype (this rank's
    share of the sequence under context / sequence parallel; bf16 with bf16 parameters)."""
    from torch.distributed.pipelining._utils import extract_tensor_metas

    tokens, hidden, dtype = boundary
    for stage, module in zip(runner.stages, runner.modules, strict=True):
        if stage.is_first:
            x = torch.zeros(micro_batch, seq_len, dtype=torch.long)
        else:
            x = torch.zeros(micro_batch, tokens, hidden, dtype=dtype)
        with torch.no_grad(), _autocast(amp):
            y = module(x)
        y = y.to_local() if isinstance(y, DTensor) else y
        # What crosses a boundary takes part in autograd (activations forward, their gradients back).
        y = torch.empty(y.shape, dtype=y.dtype, requires_grad=y.dtype.is_floating_point)
        x = x if stage.is_first else torch.empty(x.shape, dtype=x.dtype, requires_grad=True)
        stage._user_meta.inputs = extract_tensor_metas((x,))
        stage._user_meta.outputs = extract_tensor_metas((y,))
    for module in runner.modules:  # that forward gathered FSDP2's parameters; a step starts resharded
        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                sub.reshard()


def _recv_buffer_bytes(runner) -> int:
    """Bytes of the receive buffers one micro-batch has on this rank's stages (activations, gradients)."""
    total = 0
    for stage in runner.stages:
        for infos in (stage.args_recv_info.get(0, ()), stage.grad_recv_info.get(0, ())):
            for info in infos:
                buffer = getattr(info, "buffer", None)
                if isinstance(buffer, torch.Tensor):
                    total += buffer.numel() * buffer.element_size()
    return total


def _autocast(amp: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if amp else contextlib.nullcontext()


def simulate_rank(model_name: str | dict[str, Any] | Any, strategy: DistributedStrategy, world_size: int, rank: int,
                  global_batch: int, seq_len: int, num_micro: int | None = None,
                  amp: bool = True, model_overrides: dict[str, Any] | None = None,
                  moe_load_factor: float = 1.0) -> RankResult:
    """One training step of ``rank`` of ``world_size`` under ``strategy``, on fake tensors.

    ``strategy.pipeline_configs.accumulate_steps`` is the step's micro-batch count per data rank
    (global batch = data ranks x micro-batch x that); ``num_micro`` how many of them to run
    (default :func:`default_num_micro`). MoE blocks route by :func:`sampan.nn.moe_planned.planned_routing`:
    even loads, this rank's experts receiving ``moe_load_factor`` times their share.
    """
    from sampan.distributed.fleet import Fleet
    from sampan.models import create
    from sampan.nn.clip import ClipGradByGlobalNorm
    from sampan.optimizer import AdamW

    start = time.perf_counter()
    degrees = strategy.resolve_degrees(world_size)
    data_ranks = degrees["dp"] * degrees["sharding"]
    pipe = strategy.pipeline_configs
    if global_batch % data_ranks:
        raise ValueError(f"global batch {global_batch} does not split over {data_ranks} data ranks (dp x sharding)")
    local = global_batch // data_ranks
    if local % pipe.accumulate_steps:
        raise ValueError(f"a data rank's {local} sequences do not split into {pipe.accumulate_steps} micro-batches")
    micro_batch = local // pipe.accumulate_steps
    pp_rank = rank // (world_size // degrees["pp"])  # pp is the outermost mesh axis
    run_micro = num_micro if num_micro is not None else default_num_micro(strategy, degrees, pp_rank)
    if not 1 <= run_micro <= pipe.accumulate_steps:
        raise ValueError(f"num_micro must be in 1..{pipe.accumulate_steps}, got {run_micro}")
    run_strategy = DistributedStrategy.from_dict({**strategy.to_dict(),
                                                  "pipeline_configs": {**pipe.to_dict(),
                                                                       "accumulate_steps": run_micro}})
    notes: list[str] = []
    with fake_world(rank, world_size):
        fleet = Fleet()
        fleet.init(is_collective=True, strategy=run_strategy)
        hcg = fleet.hcg
        coords = {axis: hcg.mesh.get_local_rank(axis) for axis in AXES}
        front = _FakeFront()
        mode = CountingFakeMode(allow_non_fake_inputs=True)
        # Offloaded activations go to the meta device, which the count leaves out: the host's memory.
        with mode.counting(), front, offload_host("meta"), planned_routing(moe_load_factor):
            model = create(_model_config(model_name), **(model_overrides or {}))
            config = model.config
            optimizer = AdamW(learning_rate=1e-4, parameters=model.parameters(),
                              grad_clip=ClipGradByGlobalNorm(1.0))
            dmodel = fleet.distributed_model(model)
            optimizer = fleet.distributed_optimizer(optimizer)
            del model
            pipeline = dmodel._pipeline
            pure_bf16 = strategy.pure_bf16
            autocast = amp and not pure_bf16  # O2 computes in bf16 without autocast
            local_seq = seq_len // degrees["cp"]
            if pipeline is not None:
                sp = strategy.tensor_parallel_configs.sequence_parallel
                tokens = local_seq // (degrees["mp"] if sp else 1)
                positions = (rank_positions(seq_len, degrees["cp"], coords["cp"]) if degrees["cp"] > 1 else None)
                for module in pipeline.modules:  # as the runner sets them for a step
                    module.positions = positions
                _boundary_meta(pipeline, micro_batch, local_seq, (tokens, config.hidden_size,
                                                                  torch.bfloat16 if pure_bf16 else torch.float32),
                               autocast)
                stages = [s.stage_index for s in pipeline.stages]
                modules = list(pipeline.modules)
            else:
                stages = [0]
                modules = [dmodel.model]
            vocab = config.vocab_size
            rows = micro_batch * run_micro
            batch = {"input_ids": torch.randint(0, vocab, (rows, seq_len)),
                     "labels": torch.randint(0, vocab, (rows, seq_len))}
            params = sum(local_bytes(p) for m in modules for p in m.parameters())
            inner = optimizer.torch_optimizer
            gc.collect()
            at_start = mode.live
            mode.reset_peak()
            with CommCounter() as comm:
                with _autocast(autocast):
                    dmodel.forward_backward(batch)
                grads = sum(local_bytes(p.grad) for g in inner.param_groups for p in g["params"])
                peak_fb = mode.peak
                breakdown = mode.breakdown()
                mode.reset_peak()
                optimizer.step()
                optimizer.clear_grad(set_to_zero=False)
                peak_step = mode.peak
            optim = sum(local_bytes(v) for state in inner.state.values() for v in state.values()
                        if isinstance(v, torch.Tensor))
        # torch.distributed.pipelining allocates a receive buffer per micro-batch up front, for the
        # activations (every stage but the first) and their gradients (every stage but the last),
        # and keeps them: those of the micro-batches not run are added, exactly as torch sizes them.
        recv_per_micro = _recv_buffer_bytes(pipeline) if pipeline is not None else 0
        unrun = (pipe.accumulate_steps - run_micro) * recv_per_micro
        # From the second step on the optimizer state exists during forward and backward too.
        peak = {"total": max(peak_fb + optim, peak_step) + unrun, "forward_backward": peak_fb + optim + unrun,
                "optimizer_step": peak_step + unrun, "at_start": at_start, "recv_buffers_per_micro": recv_per_micro,
                "recv_buffers_added_for_unrun_micro": unrun}
        collectives = comm.totals()
    if run_micro < pipe.accumulate_steps:
        notes.append(f"ran {run_micro} of the step's {pipe.accumulate_steps} micro-batches (the schedule's peak is "
                     "reached after its warm-up); collectives are those of the micro-batches run")
        if unrun:
            notes.append(f"added {unrun / 1e9:.2f} GB of pipeline receive buffers for the {pipe.accumulate_steps - run_micro} "
                         f"micro-batches not run ({recv_per_micro / 1e6:.1f} MB each: torch.distributed.pipelining "
                         "allocates one per micro-batch up front)")
    if front.scalar_reads:
        notes.append(f"{front.scalar_reads} reads of a tensor's value (clipping's norm, token counts, the pipeline "
                     "vote) were answered with 1")
    return RankResult(rank, coords, stages, params, grads, optim, peak, collectives, run_micro,
                      time.perf_counter() - start, notes, breakdown)


def _model_config(model: str | dict[str, Any] | Any):
    """A registered name as it is; a config's dict (what crosses to a worker process) as its config."""
    if isinstance(model, dict):
        from sampan.models.registry import FAMILIES

        model_type = model.get("model_type")
        if model_type not in FAMILIES:
            raise ValueError(f"config model_type {model_type!r} is none of sampan's families {sorted(FAMILIES)}")
        return FAMILIES[model_type].config_class.from_dict(model)
    return model


def simulation_ranks(degrees: dict[str, int], which: str = "ends") -> list[int]:
    """The ranks to simulate: one per pipeline stage (``"all"``) or the first and last (``"ends"``),
    each at dp = sharding = mp coordinate 0 (ranks of one stage hold the same amounts)."""
    pp = degrees["pp"]
    stages = range(pp) if which == "all" else sorted({0, pp - 1})
    return [rank_of(degrees, {"pp": s}) for s in stages]


def _rank_job(job: dict[str, Any]) -> dict[str, Any]:
    """A pool worker's job: one :func:`simulate_rank`, as plain data both ways."""
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("torch.distributed").setLevel(logging.ERROR)
    strategy = DistributedStrategy.from_dict(job.pop("strategy"))
    return simulate_rank(strategy=strategy, **job).to_dict()


def simulate(model_name: str | dict[str, Any], strategy: DistributedStrategy, world_size: int, global_batch: int,
             seq_len: int, ranks: list[int] | None = None, stages: str = "ends", num_micro: int | None = None,
             amp: bool = True, processes: int = 2,
             model_overrides: dict[str, Any] | None = None, moe_load_factor: float = 1.0) -> list[dict[str, Any]]:
    """:func:`simulate_rank` for each of ``ranks`` (default :func:`simulation_ranks`), each in a fresh
    process (a fake group, its meshes and their caches belong to one process), ``processes`` at a time.
    ``model_name``: a registered name, or a config's ``to_dict()``.
    Returns each rank's :meth:`RankResult.to_dict`. The workers are spawned, so a script calling this
    needs an ``if __name__ == "__main__":`` guard."""
    import multiprocessing

    degrees = strategy.resolve_degrees(world_size)
    ranks = ranks if ranks is not None else simulation_ranks(degrees, stages)
    jobs = [{"model_name": model_name, "strategy": strategy.to_dict(), "world_size": world_size, "rank": r,
             "global_batch": global_batch, "seq_len": seq_len, "num_micro": num_micro, "amp": amp,
             "model_overrides": model_overrides, "moe_load_factor": moe_load_factor} for r in ranks]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(max(1, min(processes, len(jobs))), maxtasksperchild=1) as pool:
        return pool.map(_rank_job, jobs, chunksize=1)

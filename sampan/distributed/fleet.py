"""``fleet``: declare a hybrid-parallel strategy, then wrap a model and an optimizer with it.

    from sampan.distributed import fleet
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 2, "mp_degree": 2}
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(optimizer)
    loss = model.train_batch(fleet.shard_batch(batch), optimizer)

The optimizer may be built over the original model's parameters or over ``distributed_model``'s,
and Paddle's other order (``fleet.init(is_collective=True)``, then
``fleet.distributed_optimizer(optimizer, strategy=strategy)``) works too: ``Fleet`` states the rules.

The state (strategy, topology) lives in a ``Fleet`` object; the module-level functions use a
default one, as Paddle users expect. Code that wants two setups can make its own ``Fleet``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import parallelize_module

from sampan.distributed import env
from sampan.distributed.clip import HybridClipGradByGlobalNorm
from sampan.distributed.expert_parallel import apply_expert_parallel, configure_moe, expert_modules
from sampan.distributed.model import DistributedModel
from sampan.distributed.pipeline import PipelineRunner, StageNames, TiedWeightSync, build_stage_modules
from sampan.distributed.precision import cast_parameters, mixed_precision_policy
from sampan.distributed.sharding import apply_sharding
from sampan.distributed.strategy import DistributedStrategy
from sampan.distributed.tensor_parallel import (
    apply_tensor_parallel,
    stage_sequence_parallel_plan,
    uses_loss_parallel,
)
from sampan.distributed.topology import HybridCommunicateGroup
from sampan.models.pipeline_parts import PipelineParts
from sampan.models.registry import spec_of
from sampan.nn.clip import ClipGradByGlobalNorm
from sampan.nn.compile import apply_compile
from sampan.nn.recompute import apply_recompute, recompute_targets


def default_strategy() -> DistributedStrategy:
    """The strategy of a ``fleet.init`` given none: pure data parallel over every rank (Paddle's
    default ``dp_degree`` is -1, the leftover ranks)."""
    return DistributedStrategy(hybrid_configs={"dp_degree": -1})


def _flat(strategy: DistributedStrategy, world_size: int) -> dict[str, Any]:
    """``strategy`` as ``{"hybrid_configs.dp_degree": 2, ...}``, the degrees resolved for ``world_size``
    (so ``dp_degree=-1`` and ``dp_degree=2`` on 2 ranks are the same layout)."""
    out: dict[str, Any] = {}
    for key, value in strategy.to_dict().items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    out.setdefault("amp", None)
    degrees = strategy.resolve_degrees(world_size)
    for axis in ("dp", "sharding", "pp", "mp"):
        out[f"hybrid_configs.{axis}_degree"] = degrees[axis]
    return out


def _differences(a: dict[str, Any], b: dict[str, Any], keys=None) -> list[str]:
    """``["hybrid_configs.pp_degree 1 vs 2", ...]``: where two ``_flat`` strategies differ."""
    return [f"{key} {a.get(key)!r} vs {b.get(key)!r}" for key in (keys if keys is not None else a)
            if a.get(key) != b.get(key)]


class Fleet:
    """One hybrid-parallel setup: strategy, topology, and the parameter map of the wrapped model.

    The order of the calls (Paddle's, both ways):

    * ``init(is_collective=True, strategy=s)``: ``s`` is the strategy; the topology is built here.
      A strategy given to ``distributed_optimizer`` as well must equal it (else a ValueError names
      what differs).
    * ``init(is_collective=True)`` with none: the strategy is :func:`default_strategy` (pure data
      parallel) until ``distributed_optimizer(optimizer, strategy=s)`` gives one, which applies
      from then on. That works while nothing was built from the default yet; once the topology was
      read (``get_hybrid_communicate_group``, ``shard_batch``) or a model split under it, ``s`` must
      describe the same layout, else a ValueError says to pass ``s`` to ``fleet.init``.
    * ``distributed_model`` and ``distributed_optimizer`` in either order; the optimizer may be
      built over the original model's parameters or over the distributed model's.
    """

    def __init__(self) -> None:
        self.strategy: DistributedStrategy | None = None
        self._hcg: HybridCommunicateGroup | None = None
        # Where the strategy came from: "fleet.init", "distributed_optimizer", or None (the default).
        self._strategy_from: str | None = None
        self._model_split = False  # whether distributed_model has split a model under self.strategy
        # id(original parameter) -> (a weak reference to it, its distributed replacement). The weak
        # reference tells a live original from a new tensor that reuses a dead one's id.
        self._param_map: dict[int, tuple[weakref.ref, torch.Tensor]] | None = None
        self._pending: list[Any] = []  # optimizers given before distributed_model, rebound by it

    def init(self, is_collective: bool = True, strategy: DistributedStrategy | None = None) -> Fleet:
        """Join the launcher's process group (or make a one-rank group); with a strategy, build the topology.

        Without one, the strategy is :func:`default_strategy` (pure data parallel) unless
        ``distributed_optimizer(optimizer, strategy=...)`` gives one before the topology is used.
        Calling ``init`` again starts over.
        """
        if not is_collective:
            raise ValueError("only collective training (is_collective=True) is supported; "
                             "parameter-server mode is not part of sampan")
        if strategy is not None and not isinstance(strategy, DistributedStrategy):
            raise TypeError(f"strategy must be a fleet.DistributedStrategy, got {type(strategy).__name__}")
        chosen = strategy if strategy is not None else default_strategy()
        # Checked before joining: the launcher's WORLD_SIZE is known, so a layout that cannot fit fails
        # on every rank at once instead of one rank leaving while the others wait in gloo's start-up.
        self._check(chosen)
        env.init_process_group()
        self.__init__()
        self.strategy = chosen
        if strategy is not None:
            self._strategy_from = "fleet.init"
            self._topology()
        return self

    def _check(self, strategy: DistributedStrategy) -> dict[str, int]:
        strategy.check_precision()
        strategy.check_recompute()
        # Before the group exists, its size is the launcher's WORLD_SIZE; a lone process gets one rank.
        world = dist.get_world_size() if dist.is_initialized() else (env.world_size() if env.launched() else 1)
        return strategy.resolve_degrees(world)

    def _topology(self) -> HybridCommunicateGroup:
        """The topology of the strategy in force, built on first use."""
        if self.strategy is None:
            raise RuntimeError("call fleet.init(is_collective=True, strategy=...) first")
        if self._hcg is None:
            self._hcg = HybridCommunicateGroup(self._check(self.strategy), env.default_device_type(),
                                               ep_degree=self.strategy.hybrid_configs.ep_degree)
        return self._hcg

    @property
    def hcg(self) -> HybridCommunicateGroup | None:
        """The topology, or None before ``init``."""
        return self._topology() if self.strategy is not None else None

    def _require_init(self) -> HybridCommunicateGroup:
        return self._topology()

    def _take_strategy(self, strategy: DistributedStrategy) -> None:
        """Apply the strategy given to ``distributed_optimizer`` (see the class docstring)."""
        if not isinstance(strategy, DistributedStrategy):
            raise TypeError(f"strategy must be a fleet.DistributedStrategy, got {type(strategy).__name__}")
        if strategy is self.strategy:
            return
        world = dist.get_world_size()
        self._check(strategy)
        given, current = _flat(strategy, world), _flat(self.strategy, world)
        if self._strategy_from is not None:
            differ = _differences(current, given)
            if differ:
                first = "fleet.init" if self._strategy_from == "fleet.init" else "an earlier distributed_optimizer"
                raise ValueError(
                    f"{first} got one strategy and distributed_optimizer another; they differ in "
                    f"{', '.join(differ)} (the first's vs the second's). Give the strategy once: to "
                    "fleet.init(is_collective=True, strategy=strategy), or only to distributed_optimizer after "
                    "a fleet.init without one")
            return  # the same strategy, as another object
        # No strategy yet: the given one applies, unless something was built from the default.
        if self._model_split:
            built, keys = "fleet.distributed_model already split the model", None
        elif self._hcg is not None:
            built = "the topology was already built (get_hybrid_communicate_group / shard_batch)"
            keys = [f"hybrid_configs.{axis}_degree" for axis in ("dp", "sharding", "pp", "mp", "ep")]
        else:
            built, keys = None, []
        differ = _differences(current, given, keys) if built else []
        if differ:
            raise ValueError(
                f"{built} under the default strategy of a fleet.init without one (pure data parallel over "
                f"{world} ranks), but distributed_optimizer got a strategy that differs in {', '.join(differ)} "
                "(default vs given). Pass the strategy to fleet.init(is_collective=True, strategy=strategy), "
                "before fleet.distributed_model")
        self.strategy = strategy
        self._strategy_from = "distributed_optimizer"

    def get_hybrid_communicate_group(self) -> HybridCommunicateGroup:
        return self._require_init()

    def worker_index(self) -> int:
        return dist.get_rank() if dist.is_initialized() else env.rank()

    def worker_num(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else env.world_size()

    def distributed_model(self, model: nn.Module, tp_plan: dict[str, str] | None = None,
                          pipeline_parts: PipelineParts | None = None, compile: bool = False) -> DistributedModel:
        """Split ``model`` as the strategy says: tensor parallel, recompute, then dp / sharding.

        ``compile``: ``torch.compile`` each transformer block after tensor parallel and recompute,
        before sharding (torchtitan's order; ``sampan.nn.compile``).

        sampan's model families (GPT, ERNIE, Llama / Qwen) declare their splits in their spec. A
        model sampan doesn't know brings its own: ``tp_plan`` (module-name pattern -> "colwise" |
        "rowwise" | "vocab" | "shared_input") for mp > 1, ``pipeline_parts`` (a
        ``PipelineParts``: embeddings, layers, norm, head, loss) for pp > 1.
        """
        hcg = self._require_init()
        strategy = self.strategy
        degrees = hcg.degrees
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "num_heads"):
            moe = config.moe_shape() if hasattr(config, "moe_shape") else None
            strategy.validate_for_model(config.num_heads, config.num_layers, config.vocab_size, degrees,
                                        num_kv_heads=getattr(config, "num_kv_heads", None),
                                        num_experts=moe.num_experts if moe is not None else None)
        experts = self._expert_targets(model)
        if degrees["pp"] > 1:
            return self._distributed_pipeline_model(model, tp_plan, pipeline_parts, compile, experts)
        old = {id(p): (weakref.ref(p), name) for name, p in model.named_parameters(remove_duplicate=False)}
        loss_parallel = False
        if degrees["mp"] > 1:
            plan = tp_plan if tp_plan is not None else _family_split(model, "tensor_parallel_plan")
            if plan is None:
                raise ValueError(f"mp_degree {degrees['mp']} needs a tensor-parallel plan for {type(model).__name__}: "
                                 "pass tp_plan={'module.name.pattern': 'colwise' | 'rowwise' | 'vocab'}")
            sp_plan = self._sequence_parallel_plan(model, tp_plan)
            if sp_plan is not None:
                parallelize_module(model, hcg.mesh["mp"], sp_plan)
                if hasattr(model, "tie_weights"):
                    model.tie_weights()
            else:
                apply_tensor_parallel(model, hcg.mesh["mp"], plan)
            loss_parallel = uses_loss_parallel(model, plan)
        self._expert_parallel(model, experts)
        apply_recompute(model, strategy.recompute, offload=strategy.recompute_configs.enable_offload)
        apply_compile(model, compile)
        self._shard(model)
        new = dict(model.named_parameters(remove_duplicate=False))
        self._set_param_map({pid: (ref, new[name]) for pid, (ref, name) in old.items() if name in new})
        loss_kind = self._context_parallel_parts(model, None).loss if degrees["cp"] > 1 else None
        return DistributedModel(model, hcg, strategy, loss_parallel, loss_kind=loss_kind)

    def _expert_targets(self, model: nn.Module) -> set[int]:
        """ids of the experts modules expert parallelism splits (empty at ep_degree 1); a clear error
        when ep_degree > 1 finds none."""
        ep = self.strategy.hybrid_configs.ep_degree
        if ep == 1:
            return set()
        found = expert_modules(model)
        if not found:
            raise ValueError(f"ep_degree {ep} splits the experts of a Mixture-of-Experts model, but "
                             f"{type(model).__name__} has no sampan.nn.moe_experts.GroupedExperts; set ep_degree 1")
        return {id(m) for _, m in found}

    def _expert_parallel(self, module: nn.Module, targets: set[int]) -> None:
        """Expert parallel over the ``ep`` ranks for the experts modules of ``module`` in ``targets``;
        the MoE blocks' load reducer and aux-loss scale (see ``expert_parallel.configure_moe``)."""
        if targets:
            apply_expert_parallel([m for m in module.modules() if id(m) in targets], self.hcg.expert_mesh())
        configure_moe(module, self.hcg, self.strategy.pipeline_configs.accumulate_steps)

    def _shard(self, module: nn.Module) -> None:
        """FSDP2 over the data (and context-parallel) ranks, with the strategy's precision.

        Pure bf16 (O2) shards even on one data rank: FSDP2's mixed precision is what holds the fp32
        master weights and gathers the bf16 copies."""
        hcg, strategy = self.hcg, self.strategy
        cast_parameters(module, strategy)
        policy = mixed_precision_policy(strategy)
        if hcg.grad_world_size > 1 or policy is not None:
            experts = [m for m in module.modules() if getattr(m, "_sampan_expert_parallel", None) is not None]
            apply_sharding(module, hcg.data_mesh(), strategy.sharding_configs.stage, policy, experts=experts,
                           expert_mesh=hcg.expert_data_mesh())

    def _context_parallel_parts(self, model: nn.Module, parts: PipelineParts | None) -> PipelineParts:
        """The parts that tell context parallel the model's loss and how positions reach it; a clear
        error for a model that cannot run it."""
        parts = parts if parts is not None else _family_split(model, "pipeline_parts")
        cp = self.hcg.degrees["cp"]
        if parts is None:
            raise ValueError(f"cp_degree {cp} needs to know {type(model).__name__}'s loss and positions: pass "
                             "pipeline_parts=PipelineParts(..., positions='embeddings' | 'rotary') (sampan's GPT, "
                             "Llama / Qwen causal LMs and ERNIE's MLM have theirs)")
        if parts.positions == "none":
            raise ValueError(f"cp_degree {cp}: {type(model).__name__}'s PipelineParts say positions='none', so the "
                             "model cannot be told which token positions a rank holds; declare positions="
                             "'embeddings' or 'rotary' in its PipelineParts")
        return parts

    def _sequence_parallel_plan(self, model: nn.Module, tp_plan: dict[str, str] | None) -> dict[str, object] | None:
        """The family's sequence-parallel plan when the strategy asks for one (at mp > 1), else None."""
        if not self.strategy.tensor_parallel_configs.sequence_parallel:
            return None
        sp_plan = _family_split(model, "sequence_parallel_plan") if tp_plan is None else None
        if sp_plan is None:
            raise ValueError("sequence_parallel needs a model family's sequence-parallel plan (sampan's GPT, "
                             f"ERNIE and Llama / Qwen have one); {type(model).__name__} with a custom "
                             "tp_plan has none")
        return sp_plan

    def _distributed_pipeline_model(self, model: nn.Module, tp_plan: dict[str, str] | None,
                                    parts: PipelineParts | None, compile: bool = False,
                                    experts: set[int] | None = None) -> DistributedModel:
        """pp > 1: keep only this rank's stages, then tensor parallel, recompute and sharding per stage."""
        hcg, strategy = self.hcg, self.strategy
        degrees = hcg.degrees
        parts = parts if parts is not None else _family_split(model, "pipeline_parts")
        if parts is None:
            raise ValueError(f"pp_degree {degrees['pp']} needs pipeline split points for {type(model).__name__}: pass "
                             "pipeline_parts=PipelineParts(embeddings, layers, norm, lm_head, loss) "
                             "(sampan's language models have theirs: GPT and Llama / Qwen causal LMs, ERNIE's MLM)")
        if degrees["cp"] > 1:
            self._context_parallel_parts(model, parts)
        tied = {id(p) for p in parts.embeddings.parameters()} & {id(p) for p in parts.lm_head.parameters()}
        pipe = strategy.pipeline_configs
        virtual = pipe.virtual_pp_degree
        stages = build_stage_modules(parts, hcg.get_stage_id(), degrees["pp"], virtual)
        names = StageNames.of(model, [m for _, m in stages])
        old = {id(p): (weakref.ref(p), k, name) for k, (_, m) in enumerate(stages) for name, p in m.named_parameters()}
        plan = tp_plan if tp_plan is not None else _family_split(model, "tensor_parallel_plan")
        sp_plan = self._sequence_parallel_plan(model, tp_plan) if degrees["mp"] > 1 else None
        model_names = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
        for _, module in stages:
            if degrees["mp"] > 1:
                if plan is None:
                    raise ValueError(f"mp_degree {degrees['mp']} needs a tensor-parallel plan for "
                                     f"{type(model).__name__}")
                # The plans are written against the model's names; a stage holds the same modules
                # under its own (``embeddings``, ``layers.0``), so match by the model's.
                as_model = {name: model_names.get(id(m), name) for name, m in module.named_modules()}
                if sp_plan is not None:
                    held = {name: model_names[id(m)] for name, m in module.named_modules() if id(m) in model_names}
                    parallelize_module(module, hcg.mesh["mp"],
                                       stage_sequence_parallel_plan(sp_plan, held, module.lm_head is not None))
                else:
                    apply_tensor_parallel(module, hcg.mesh["mp"], plan, require_match=False, match_names=as_model)
            self._expert_parallel(module, experts or set())
            apply_recompute(module, strategy.recompute, offload=strategy.recompute_configs.enable_offload)
            if compile and recompute_targets(module):  # the embedding / head stages have no blocks
                apply_compile(module, compile)
            self._shard(module)
        news = [dict(m.named_parameters()) for _, m in stages]
        param_map = {pid: news[k][name] for pid, (_, k, name) in old.items()}
        tied_params = [param_map[pid] for pid in tied if pid in param_map]
        num_stages = degrees["pp"] * virtual
        for (index, _module), new in zip(stages, news, strict=True):
            if index == num_stages - 1:
                for pid in tied:
                    if pid in param_map and any(q is param_map[pid] for q in new.values()):
                        param_map[pid]._sampan_pipeline_duplicate = True
        device = env.local_device()
        zero3 = hcg.grad_world_size > 1 and strategy.sharding_configs.stage == 3
        # The head's logits stay split by vocabulary (a DTensor) for the parallel cross-entropy, as
        # without a pipeline: gathered, the last stage would hold mp times the logits.
        loss_parallel = degrees["mp"] > 1 and (sp_plan is not None or (plan is not None and uses_loss_parallel(model, plan)))
        runner = PipelineRunner(stages, num_stages, hcg.get_pipe_parallel_group(), pipe.schedule_mode,
                                pipe.accumulate_steps, parts.loss, device, zero3=zero3, loss_parallel=loss_parallel)
        sync = TiedWeightSync(hcg.mesh, tied_params) if tied else None
        self._set_param_map({pid: (old[pid][0], q) for pid, q in param_map.items()})
        return DistributedModel(model, hcg, strategy, loss_parallel=False, pipeline=runner, tied_sync=sync,
                                stage_names=names)

    def _set_param_map(self, param_map: dict[int, tuple[weakref.ref, torch.Tensor]]) -> None:
        """Record how the model's parameters were replaced, and rebind the optimizers waiting for it."""
        self._param_map = param_map
        self._model_split = True
        pending, self._pending = self._pending, []
        for optimizer in pending:
            self._rebind(optimizer)

    def distributed_optimizer(self, optimizer, strategy: DistributedStrategy | None = None):
        """Point ``optimizer`` at the distributed parameters and make its clipping global across ranks.

        ``optimizer`` may hold the original model's parameters (built before ``distributed_model``)
        or the distributed model's (built after). Called before ``distributed_model``, the
        optimizer is rebound when the model is split. ``strategy``: Paddle's second place for it,
        for a ``fleet.init`` given none (see the class docstring for the rules).
        """
        if self.strategy is None:
            raise RuntimeError("call fleet.init(is_collective=True, strategy=...) first")
        if strategy is not None:
            self._take_strategy(strategy)
        hcg = self._topology()
        if self._param_map is None:
            self._pending.append(optimizer)
        else:
            self._rebind(optimizer)
        if isinstance(optimizer.grad_clip, ClipGradByGlobalNorm):
            pp_group = hcg.get_pipe_parallel_group() if hcg.degrees["pp"] > 1 else None
            optimizer.grad_clip = HybridClipGradByGlobalNorm(optimizer.grad_clip.clip_norm, pp_group)
        return optimizer

    def _rebind(self, optimizer) -> None:
        """Replace each parameter ``optimizer`` holds by its distributed counterpart."""
        param_map = self._param_map
        distributed = {id(q) for _, q in param_map.values()}
        # With pp > 1, other stages' parameters are not this rank's to update (or to hold state
        # for); without, a tensor that is no parameter of the model stays as it was.
        keep_others = self._topology().degrees["pp"] == 1

        def new_parameter(p: torch.Tensor) -> torch.Tensor | None:
            if id(p) in distributed:  # already the distributed model's (the optimizer was built after)
                return p
            entry = param_map.get(id(p))
            if entry is not None and entry[0]() is p:  # an original parameter (not a reused id)
                return entry[1]
            return p if keep_others else None

        optimizer.rebind_parameters(new_parameter)

    def shard_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """This rank's slice of a global batch: one of ``dp x sharding`` equal parts along dim 0."""
        hcg = self._require_init()
        n, r = hcg.data_world_size, hcg.data_rank
        out = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                if value.shape[0] % n:
                    raise ValueError(f"global batch of {value.shape[0]} ({key}) does not split over {n} data-parallel "
                                     "ranks; make it a multiple of dp_degree x sharding_degree")
                size = value.shape[0] // n
                value = value[r * size:(r + 1) * size]
            out[key] = value
        return out


def _family_split(model: nn.Module, name: str):
    """The model family's ``tensor_parallel_plan`` / ``sequence_parallel_plan`` / ``pipeline_parts``
    of ``model``, or None when sampan doesn't know the model."""
    spec = spec_of(model)
    return getattr(spec.parallel(), name)(model) if spec is not None else None


_default = Fleet()
init = _default.init
distributed_model = _default.distributed_model
distributed_optimizer = _default.distributed_optimizer
get_hybrid_communicate_group = _default.get_hybrid_communicate_group
worker_index = _default.worker_index
worker_num = _default.worker_num
shard_batch = _default.shard_batch

__all__ = ["DistributedStrategy", "Fleet", "PipelineParts", "default_strategy", "distributed_model",
           "distributed_optimizer", "get_hybrid_communicate_group", "init", "shard_batch", "worker_index", "worker_num"]

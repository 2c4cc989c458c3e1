"""What changes in the ``Trainer`` when ``TrainingArguments.strategy`` is set: it trains on fleet.

The Trainer keeps its loop (schedule, logging, evaluation cadence, non-finite guard, checkpoints);
``FleetBackend`` is its ``TrainingBackend`` on a hybrid-parallel layout (``LocalBackend`` in
``backend.py`` is the one-process one, with the same interface) and owns what differs there:

* the model and optimizer go through ``fleet.distributed_model`` / ``distributed_optimizer``;
* each step's micro-batches run in one ``forward_backward`` (pipeline schedule or accumulation),
  which returns the global mean loss on every rank, so all ranks take the same skip decision;
* clipping is by the global norm across every axis (``HybridClipGradByGlobalNorm``);
* evaluation walks global batches (per-device size x data ranks), each rank running its share;
* throughput and MFU are the whole job's (tokens x data ranks, peak x world size);
* checkpoints are DCP shards under the model's own names plus the trainer state, with a manifest,
  so a run resumes at another layout (dp / mp / pp / sharding degrees) or in one process.

The Trainer's ``gradient_accumulation_steps`` is the strategy's ``accumulate_steps`` (the
micro-batches per step, which a pipeline needs at least ``pp_degree`` of), and its ``recompute``
and ``amp`` feed the strategy's; setting both sides differently is an error.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from sampan.checkpoint import capture_rng_state, load_checkpoint, restore_rng_state
from sampan.checkpoint.discovery import checkpoint_dir_name
from sampan.checkpoint.store import rotate_checkpoints
from sampan.distributed import env
from sampan.distributed.checkpoint import load_distributed, save_distributed
from sampan.distributed.clip import HybridClipGradByGlobalNorm, global_grad_norm
from sampan.distributed.fleet import Fleet
from sampan.distributed.strategy import DistributedStrategy
from sampan.io import DataLoader
from sampan.nn.recompute import apply_recompute
from sampan.trainer.training_backend import AutocastFn, LossFn, TrainingBackend, to_device
from sampan.utils.device import local_rank
from sampan.utils.loss_weights import loss_token_count

TRAINER_STATE = "trainer_state"


def strategy_for(args) -> DistributedStrategy:
    """The strategy of ``args.strategy`` with the Trainer's accumulation, recompute and AMP folded in."""
    strategy = DistributedStrategy.from_dict(args.strategy)
    pipe = strategy.pipeline_configs
    if pipe.accumulate_steps not in (1, args.gradient_accumulation_steps):
        raise ValueError(
            f"strategy pipeline_configs accumulate_steps={pipe.accumulate_steps} disagrees with "
            f"gradient_accumulation_steps={args.gradient_accumulation_steps}; set only gradient_accumulation_steps "
            "(the Trainer passes it to the strategy)")
    strategy.pipeline_configs = {"accumulate_steps": args.gradient_accumulation_steps}
    if strategy.recompute != "none" and args.recompute not in ("none", strategy.recompute):
        raise ValueError(f"strategy recompute={strategy.recompute!r} disagrees with recompute={args.recompute!r}; "
                         "set one of them")
    if args.recompute not in ("none", "moe"):  # "moe" is applied by FleetBackend.setup, after the split
        strategy.recompute = args.recompute
    amp = args.amp or strategy.amp
    if args.amp and strategy.amp and args.amp != strategy.amp:
        raise ValueError(f"strategy amp={strategy.amp!r} disagrees with amp={args.amp!r}; set one of them")
    if amp == "fp16":
        raise ValueError("amp='fp16' (dynamic loss scaling) is not supported with a strategy yet; use amp='bf16'")
    strategy.amp = amp
    return strategy


def is_distributed_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds DCP shards (written by a run with a strategy)."""
    return (Path(path) / ".metadata").is_file()


def load_into_one_process(path: Path, model: nn.Module, optimizer) -> dict[str, Any]:
    """Resume a run without a strategy from a checkpoint written with one (DCP reshards it)."""
    load_distributed(path, model, optimizer)
    saved = load_checkpoint(path, verify=False, components=[TRAINER_STATE])[TRAINER_STATE]
    restore_rng_state(saved["rng"][0])
    return saved


class FleetBackend(TrainingBackend):
    """The model, optimizer and collectives of a Trainer running on a hybrid-parallel layout."""

    def __init__(self, args):
        """Join the job's process group and build the topology (the model comes in ``setup``)."""
        super().__init__(args)
        args = self.args  # amp resolved for the device
        if self.device.type == "cuda" and self.device.index != local_rank():
            raise ValueError(f"device {args.device!r} with a strategy: each rank trains on its own GPU "
                             f"(cuda:$LOCAL_RANK = cuda:{local_rank()}); use device 'auto' or 'cuda'")
        env.use_device(self.device)
        self.strategy = strategy_for(args)
        self.fleet = Fleet().init(is_collective=True, strategy=self.strategy)
        self.hcg = self.fleet.get_hybrid_communicate_group()
        self._pp_group = self.hcg.get_pipe_parallel_group() if self.hcg.degrees["pp"] > 1 else None
        self.max_grad_norm = args.max_grad_norm
        self._warned_eval_tail = False

    def check_compute_metrics(self, compute_metrics) -> None:
        if compute_metrics is not None:
            raise ValueError("compute_metrics is not supported with a strategy yet (eval reports the loss only)")

    def setup(self, model: nn.Module, schedule) -> None:
        """Build the optimizer, split ``model`` by the strategy and point the optimizer at the split
        parameters (fleet applies recompute itself, inside each stage, before sharding)."""
        model.to(self.device)  # before the optimizer, so its state is created next to the parameters
        self._build_optimizer_and_scaler(model, schedule)
        config = getattr(model, "config", None)
        # How to build the unsplit model again (for save_pretrained): its class and a copy of its config.
        self._rebuild = (type(model), copy.deepcopy(config)) if hasattr(model, "save_pretrained") else None
        self.model = self.fleet.distributed_model(model, compile=self.args.compile)
        if self.args.recompute == "moe":
            # The MoE blocks as the split left them (each stage's, with expert parallelism's hooks
            # inside): the strategy's recompute modes are whole blocks only.
            apply_recompute(self.model, "moe")
        self.optimizer = self.fleet.distributed_optimizer(self.optimizer)
        # Splitting places the parameters on the mesh's device (a GPU under NCCL): batches follow them.
        self.device = next((p.device for p in self.model.parameters()), self.device)

    # -- who this rank is ---------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def data_rank(self) -> int:
        return self.hcg.data_rank

    @property
    def data_world_size(self) -> int:
        return self.hcg.data_world_size

    def barrier(self) -> None:
        dist.barrier()

    # -- one step ------------------------------------------------------------------------------
    def forward_backward(self, micro: list[dict[str, Any]], compute_loss: LossFn, autocast: AutocastFn) -> float:
        """Run this rank's micro-batches of one step as one ``model.forward_backward`` (the pipeline
        schedule or accumulation; ``compute_loss`` is not used); the global mean loss, equal on every rank."""
        with self._autocast(autocast):
            if not all(isinstance(b, dict) for b in micro):
                raise TypeError("with a strategy, batches must be dicts of tensors (input_ids, labels, ...)")
            batch = {k: torch.cat([b[k] for b in micro]) if isinstance(micro[0][k], torch.Tensor) else micro[0][k]
                     for k in micro[0]}
            return float(self.model.forward_backward(batch))

    def _autocast(self, autocast: AutocastFn):
        """The Trainer's autocast, except at AMP level O2, where the parameters are bf16 themselves
        (FSDP2 mixed precision) and autocast would only recast what is already bf16."""
        return contextlib.nullcontext() if self.strategy.pure_bf16 else autocast()

    def clip_gradients(self) -> float:
        """Clip to ``max_grad_norm`` by the norm over every axis (0: only measure); returns the norm."""
        if self.scaler.is_enabled():  # never: strategy_for turns fp16 down
            self.scaler.unscale_(self.optimizer)
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        if self.max_grad_norm > 0:
            return float(HybridClipGradByGlobalNorm(self.max_grad_norm, self._pp_group)(params))
        return float(global_grad_norm(params, self._pp_group))

    # -- evaluation ------------------------------------------------------------------------------
    @torch.no_grad()
    def eval_loss(self, dataset, collate_fn, compute_loss: LossFn, autocast: AutocastFn,
                  predict: bool = False) -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
        """Mean eval loss on a hybrid-parallel layout: every rank walks the same global batches
        (``per_device_eval_batch_size`` x data ranks) and runs its share; a last partial global
        batch that cannot split evenly over the data ranks is left out (and said so). No
        predictions (``check_compute_metrics`` turns ``compute_metrics`` down)."""
        size = self.args.per_device_eval_batch_size * self.data_world_size
        if len(dataset) < size:
            raise ValueError(f"eval_dataset has {len(dataset)} samples, fewer than one global eval batch of {size} "
                             "(per_device_eval_batch_size x data-parallel ranks); lower per_device_eval_batch_size")
        if len(dataset) % size and self.is_main and not self._warned_eval_tail:
            self._warned_eval_tail = True
            warnings.warn(f"evaluation leaves out the last {len(dataset) % size} of {len(dataset)} samples (they do "
                          f"not fill a global eval batch of {size})", stacklevel=3)
        loader = DataLoader(dataset, batch_size=size, shuffle=False, drop_last=True, collate_fn=collate_fn)
        total, count = 0.0, 0.0
        for batch in loader:
            batch = to_device(batch, self.device)
            with self._autocast(autocast):
                # Every rank passes the same global batch; each runs its share.
                loss = float(self.model.eval_batch(self.fleet.shard_batch(batch)))
            n = loss_token_count(self.model, batch)
            total += loss * n
            count += n
        return total / max(count, 1.0), [], []

    # -- checkpoints ---------------------------------------------------------------------------
    def save_pretrained(self, checkpoint: Path, directory: Path) -> Path:
        """The whole model, unsplit, as ``save_pretrained`` writes it, from a checkpoint of this run.

        Rank 0 builds the model afresh and loads the DCP shards into it without collectives
        (a distributed checkpoint holds every slice); the other ranks wait.
        """
        if self._rebuild is None:
            raise ValueError("save_pretrained needs a sampan model (with save_pretrained); this run's model has none")
        directory = Path(directory)
        if self.is_main:
            cls, config = self._rebuild
            with torch.device("cpu"):
                model = cls(config)
            load_distributed(checkpoint, model, no_dist=True)
            model.save_pretrained(directory)
        self.barrier()
        return directory

    def save(self, output_dir: Path, step: int, trainer_state: dict[str, Any],
             save_total_limit: int | None = None) -> Path:
        """Shards of every rank + rank 0's trainer state (with every rank's RNG) + manifest; rank 0
        then rotates old checkpoints, and every rank waits for it."""
        rngs: list[Any] = [None] * self.world_size
        # Trusted: these objects come from this job's own ranks over its process group, not from disk.
        dist.all_gather_object(rngs, capture_rng_state())
        state = {**trainer_state, "rng": rngs, "world_size": self.world_size, "degrees": dict(self.hcg.degrees)}
        path = save_distributed(output_dir / checkpoint_dir_name(step), self.model, self.optimizer,
                                components={TRAINER_STATE: state}, step=step)
        if self.is_main and save_total_limit is not None:
            rotate_checkpoints(output_dir, save_total_limit, keep=path)
        self.barrier()
        return path

    def load(self, path: Path) -> dict[str, Any]:
        """Load shards at this layout; returns the trainer state. RNG streams are restored per rank
        when the world size is unchanged (else the run continues correctly, but not bit for bit)."""
        if not is_distributed_checkpoint(path):
            raise ValueError(f"{path} is a single-process checkpoint; a run with a strategy resumes from "
                             "checkpoints written with one (convert by loading it in one process with "
                             "fleet and saving)")
        load_distributed(path, self.model, self.optimizer)
        saved = load_checkpoint(path, verify=False, components=[TRAINER_STATE])[TRAINER_STATE]
        rngs = saved["rng"]
        if len(rngs) == self.world_size:
            restore_rng_state(rngs[self.rank])
        else:
            if self.is_main:
                warnings.warn(f"resuming a {len(rngs)}-rank checkpoint on {self.world_size} ranks: random streams "
                              "(dropout) start afresh, so the run is not bit-identical to an uninterrupted one",
                              stacklevel=3)
            restore_rng_state(rngs[0])
        return saved

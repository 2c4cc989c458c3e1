"""Where a ``Trainer`` runs: one process (``LocalBackend``) or one rank of a fleet job (``FleetBackend``).

The Trainer owns the loop: the schedule, the non-finite-loss guard, logging, the evaluation and
checkpoint cadences, callbacks. Everything that depends on *where* the run happens is a
``TrainingBackend`` method, so the loop is written once and never asks which backend it has:

============================  ==========================================  ==========================================
concern                       ``LocalBackend``                            ``FleetBackend`` (``fleet_backend.py``)
============================  ==========================================  ==========================================
who am I                      rank 0 of 1, main, data rank 0 of 1         the process group's rank; data rank of hcg
``setup``                     AdamW; recompute applied in place           AdamW, then ``distributed_model`` /
                                                                          ``distributed_optimizer`` (recompute inside)
``forward_backward``          per micro-batch autocast forward, loss      one ``model.forward_backward`` over the
                              weighted by its share of loss terms,        concatenated micro-batches (pipeline
                              GradScaler-scaled backward                  schedule or accumulation), under autocast
``clip_gradients``            fp16 unscale, ``clip_grad_norm_``           norm over every axis (hybrid clip)
``optimizer_step``            GradScaler step / update, or plain step     (shared: the scaler is never on with fleet)
``eval_loss``                 per-device batches, optional predictions    global batches, each rank runs its share
``save`` / ``load``           sampan's atomic checkpoint, one RNG         DCP shards + trainer state with every
                              stream; also resumes from DCP shards        rank's RNG stream; rotation on rank 0
``save_pretrained``           the model's own ``save_pretrained``         rank 0 rebuilds the unsplit model
``job_totals``                as is                                       x data-parallel ranks
============================  ==========================================  ==========================================

``make_backend(args)`` is the one place that picks the backend: ``FleetBackend`` when
``args.strategy`` is set, else ``LocalBackend``.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sampan.amp import GradScaler, resolve_amp
from sampan.checkpoint import capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint
from sampan.io import DataLoader
from sampan.nn.compile import apply_compile
from sampan.nn.recompute import apply_recompute
from sampan.optimizer import AdamW
from sampan.utils.device import resolve_device
from sampan.utils.loss_weights import loss_token_count

# compute_loss(model, batch) -> scalar loss; autocast() -> the forward passes' autocast context.
LossFn = Callable[[nn.Module, Any], torch.Tensor]
AutocastFn = Callable[[], AbstractContextManager]


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (a tensor, or dicts / lists / tuples of them) moved to ``device``.

    The copies are non-blocking, which overlaps them with compute when the batch comes from pinned
    memory (the Trainer's loader pins on a GPU run); on the CPU they are no-ops.
    """
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def build_optimizer(model: nn.Module, args, schedule) -> AdamW:
    """AdamW over ``model``'s trainable parameters as ``args`` say, stepping ``schedule``."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            # Biases and norm scales are not decayed (decaying them only hurts).
            (decay if param.dim() >= 2 else no_decay).append(param)
    return AdamW(
        learning_rate=schedule, beta1=args.adam_beta1, beta2=args.adam_beta2, epsilon=args.adam_epsilon,
        weight_decay=args.weight_decay,
        parameters=[{"params": decay}, {"params": no_decay, "weight_decay": 0.0}] if no_decay else decay,
    )


class TrainingBackend(abc.ABC):
    """The part of a training run that depends on where it runs (see the module docstring).

    Lifecycle: construct with the run's ``TrainingArguments``, which resolves ``device`` (the
    ``torch.device`` to train on) and ``args`` (a copy whose ``amp`` "auto" is replaced by what it
    means on that device, so nothing downstream sees "auto"); the Trainer builds its data loader
    from ``data_rank`` / ``data_world_size``, then calls ``setup(model, schedule)``, after which
    ``model``, ``optimizer``, ``scaler`` and ``device`` are the ones to train with.

    One step, as the Trainer runs it: ``forward_backward`` (the step's mean loss, equal on every
    rank, so all ranks take the same skip decision); on a non-finite loss ``zero_grad`` and skip;
    else ``clip_gradients`` (the global norm), ``optimizer_step`` (False when the fp16 loss scaler
    skipped the update), ``zero_grad``.
    """

    def __init__(self, args):
        self.device = resolve_device(args.device)
        amp = resolve_amp(args.amp, self.device)
        self.args = args if amp == args.amp else dataclasses.replace(args, amp=amp)
        self.model: nn.Module | None = None
        self.optimizer: Any = None
        self.scaler: Any = None

    # -- who this process is --------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank in the job."""

    @property
    @abc.abstractmethod
    def world_size(self) -> int:
        """Processes in the job."""

    @property
    @abc.abstractmethod
    def is_main(self) -> bool:
        """Whether this process reports for the job (progress, metrics.jsonl, TensorBoard)."""

    @property
    @abc.abstractmethod
    def data_rank(self) -> int:
        """Which shard of the training data this process reads."""

    @property
    @abc.abstractmethod
    def data_world_size(self) -> int:
        """How many shards the training data is split into (the data-parallel degree)."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Wait for every process of the job."""

    @abc.abstractmethod
    def check_compute_metrics(self, compute_metrics: Callable | None) -> None:
        """Raise if this backend cannot evaluate with ``compute_metrics``."""

    # -- model and optimizer --------------------------------------------------------------------
    @abc.abstractmethod
    def setup(self, model: nn.Module, schedule) -> None:
        """Build the optimizer and loss scaler for ``model`` and place / wrap it for training."""

    def _build_optimizer_and_scaler(self, model: nn.Module, schedule) -> None:
        self.optimizer = build_optimizer(model, self.args, schedule)
        self.scaler = GradScaler(self.device.type, enable=self.args.amp == "fp16")

    # -- one step -------------------------------------------------------------------------------
    @abc.abstractmethod
    def forward_backward(self, micro: list[Any], compute_loss: LossFn, autocast: AutocastFn) -> float:
        """Forward and backward over one step's micro-batches; the step's mean loss (the job's)."""

    @abc.abstractmethod
    def clip_gradients(self) -> float:
        """Unscale fp16 gradients, clip to ``max_grad_norm`` (0: only measure); the global norm."""

    def optimizer_step(self) -> bool:
        """Apply the update (through the fp16 loss scaler when on); False when the scaler skipped it."""
        if self.scaler.is_enabled():
            scale = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return self.scaler.get_scale() >= scale  # the scaler backs off only when it skipped
        self.optimizer.step()
        return True

    def zero_grad(self) -> None:
        """Drop the step's gradients."""
        self.optimizer.clear_grad(set_to_zero=False)

    def job_totals(self, tokens: int, flops: float) -> tuple[int, float]:
        """This process's tokens and model FLOPs of a step -> the whole job's (for throughput and MFU)."""
        return tokens * self.data_world_size, flops * self.data_world_size

    def job_peak_flops(self, peak: float) -> float:
        """One device's peak FLOP/s -> the job's (MFU is of the whole job)."""
        return peak * self.world_size

    # -- evaluation -----------------------------------------------------------------------------
    @abc.abstractmethod
    def eval_loss(self, dataset, collate_fn: Callable | None, compute_loss: LossFn, autocast: AutocastFn,
                  predict: bool = False) -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
        """Mean loss over ``dataset`` (weighted by loss terms); with ``predict`` also the model's
        outputs and the labels of each batch (for ``compute_metrics``), else two empty lists."""

    # -- checkpoints ----------------------------------------------------------------------------
    @abc.abstractmethod
    def save(self, output_dir: Path, step: int, trainer_state: dict[str, Any],
             save_total_limit: int | None = None) -> Path:
        """Write the checkpoint of ``step`` (model, optimizer, ``trainer_state`` plus the RNG
        streams), keep at most ``save_total_limit``; every process returns once it is complete."""

    @abc.abstractmethod
    def load(self, path: Path) -> dict[str, Any]:
        """Load model and optimizer from checkpoint ``path`` and restore the RNG streams; returns
        the trainer state that ``save`` was given."""

    @abc.abstractmethod
    def save_pretrained(self, checkpoint: Path, directory: Path) -> Path:
        """Write the whole trained model to ``directory`` (``save_pretrained`` format); ``checkpoint``
        is this run's newest checkpoint, which a split model is rebuilt from."""


class LocalBackend(TrainingBackend):
    """One process: the model moves to ``args.device``; checkpoints are sampan's atomic ones."""

    @property
    def rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_main(self) -> bool:
        return True

    @property
    def data_rank(self) -> int:
        return 0

    @property
    def data_world_size(self) -> int:
        return 1

    def barrier(self) -> None:
        pass

    def check_compute_metrics(self, compute_metrics: Callable | None) -> None:
        pass

    def setup(self, model: nn.Module, schedule) -> None:
        # Placed first, so the optimizer's state is created next to the parameters it updates.
        model.to(self.device)
        apply_recompute(model, self.args.recompute)
        apply_compile(model, self.args.compile)  # after recompute: the compiled block holds the checkpoint
        self._build_optimizer_and_scaler(model, schedule)
        self.model = model

    def forward_backward(self, micro: list[Any], compute_loss: LossFn, autocast: AutocastFn) -> float:
        model = self.model
        # Each micro-batch's mean loss is weighted by its share of the step's loss terms, so the
        # step equals one big batch even when micro-batches hold different numbers of labelled
        # tokens (MLM masks, padding).
        counts = [loss_token_count(model, batch) for batch in micro]
        total_count = sum(counts)
        weights = [c / total_count for c in counts] if total_count > 0 else [1.0 / len(micro)] * len(micro)
        losses = []
        for batch, weight in zip(micro, weights, strict=True):
            with autocast():
                loss = compute_loss(model, batch)
            losses.append(loss.detach().float() * weight)
            self.scaler.scale(loss * weight).backward()
        return float(torch.stack(losses).sum())

    def clip_gradients(self) -> float:
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        max_norm = self.args.max_grad_norm
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf))

    def eval_loss(self, dataset, collate_fn: Callable | None, compute_loss: LossFn, autocast: AutocastFn,
                  predict: bool = False) -> tuple[float, list[torch.Tensor], list[torch.Tensor]]:
        model = self.model
        loader = DataLoader(dataset, batch_size=self.args.per_device_eval_batch_size, shuffle=False,
                            collate_fn=collate_fn)
        was_training = model.training
        model.eval()
        total, count, predictions, labels = 0.0, 0, [], []
        try:
            for batch in loader:
                batch = to_device(batch, self.device)
                with autocast():
                    loss = compute_loss(model, batch)
                    if predict and isinstance(batch, dict) and "labels" in batch:
                        predictions.append(model(**{k: v for k, v in batch.items() if k != "labels"}).float())
                        labels.append(batch["labels"])
                # Weight each batch by what its mean loss averages over, so a short last batch counts
                # for what it is.
                n = loss_token_count(model, batch)
                total += float(loss) * n
                count += n
        finally:
            model.train(was_training)
        return total / max(count, 1), predictions, labels

    def save(self, output_dir: Path, step: int, trainer_state: dict[str, Any],
             save_total_limit: int | None = None) -> Path:
        # This process's RNG streams go in right after the counters (the order checkpoints always had).
        trainer_state = {"state": trainer_state["state"], "rng": capture_rng_state(), **trainer_state}
        return save_checkpoint(
            output_dir, step,
            {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
             "trainer_state": trainer_state},
            save_total_limit=save_total_limit,
        )

    def load(self, path: Path) -> dict[str, Any]:
        if (Path(path) / ".metadata").is_file():  # DCP shards: a checkpoint of a run with a strategy
            from sampan.trainer.fleet_backend import load_into_one_process  # torch.distributed: seconds

            return load_into_one_process(path, self.model, self.optimizer)
        parts = load_checkpoint(path)
        self.model.load_state_dict(parts["model"], strict=True)
        self.optimizer.set_state_dict(parts["optimizer"])
        saved = parts["trainer_state"]
        restore_rng_state(saved["rng"])
        return saved

    def save_pretrained(self, checkpoint: Path, directory: Path) -> Path:
        return self.model.save_pretrained(directory)


def make_backend(args) -> TrainingBackend:
    """The backend a run with ``args`` trains on: fleet when ``args.strategy`` is set (this joins
    the job's process group), else this process alone."""
    if args.strategy is None:
        return LocalBackend(args)
    from sampan.trainer.fleet_backend import FleetBackend  # torch.distributed costs seconds to import

    return FleetBackend(args)

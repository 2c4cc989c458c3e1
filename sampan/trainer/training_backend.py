"""``TrainingBackend``: the interface of where a ``Trainer`` runs, and what its backends share.

``LocalBackend`` (``backend.py``) and ``FleetBackend`` (``fleet_backend.py``) both implement it;
``backend.py``'s docstring tabulates how each does. It lives apart from both so that neither
backend imports the other to get it: ``backend.py`` imports ``fleet_backend.py`` (lazily, to pick
it or resume from its shards), never the reverse.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sampan.amp import GradScaler, resolve_amp
from sampan.optimizer import AdamW
from sampan.utils.device import resolve_device

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

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
``args.strategy`` is set, else ``LocalBackend``. The interface and what both backends share
(``to_device``, ``build_optimizer``) are in ``training_backend.py``, which both import: this file
imports ``fleet_backend.py`` (lazily), never the reverse.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sampan.checkpoint import capture_rng_state, load_checkpoint, restore_rng_state, save_checkpoint
from sampan.io import DataLoader
from sampan.nn.compile import apply_compile
from sampan.nn.recompute import apply_recompute
from sampan.trainer.moe_logging import has_moe, set_micro_batch_scale
from sampan.trainer.training_backend import AutocastFn, LossFn, TrainingBackend, to_device
from sampan.trainer.training_backend import build_optimizer as build_optimizer  # re-exported
from sampan.utils.loss_weights import loss_token_count


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
        self._moe = has_moe(model)

    def forward_backward(self, micro: list[Any], compute_loss: LossFn, autocast: AutocastFn) -> float:
        model = self.model
        # Each micro-batch's mean loss is weighted by its share of the step's loss terms, so the
        # step equals one big batch even when micro-batches hold different numbers of labelled
        # tokens (MLM masks, padding).
        counts = [loss_token_count(model, batch) for batch in micro]
        total_count = sum(counts)
        weights = [c / total_count for c in counts] if total_count > 0 else [1.0 / len(micro)] * len(micro)
        if self._moe:  # balancing losses join the gradients in backward, weighed as the main loss
            set_micro_batch_scale(model, len(micro), self.scaler.get_scale() if self.scaler.is_enabled() else 1.0)
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

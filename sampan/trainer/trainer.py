"""``Trainer``: the training loop every sampan recipe runs through.

One step: ``gradient_accumulation_steps`` micro-batches (forward under autocast, backward of
loss / accumulation), a non-finite-loss guard, fp16 unscale, global-norm clipping, the optimizer
step (skipped by the fp16 loss scaler on overflow), the LR schedule, then logging, evaluation and
checkpoints on their own cadences. A checkpoint holds everything the next step depends on (model,
optimizer, schedule, loss scaler, RNG streams, data position, counters), so a run killed at any
point and resumed from its last checkpoint continues bit for bit as if it had never stopped.

Where the run happens (one process, or one rank of a hybrid-parallel job) is the ``backend``'s
business (``backend.py``): the loop below is the same for every backend and never asks which.
"""

from __future__ import annotations

import math
import random
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from sampan.amp import auto_cast, cpu_gemm_rates
from sampan.checkpoint import resolve_resume
from sampan.checkpoint.discovery import checkpoint_dir_name
from sampan.io import DataLoader
from sampan.trainer import moe_logging
from sampan.trainer.arguments import TrainingArguments
from sampan.trainer.backend import TrainingBackend, make_backend, to_device
from sampan.trainer.callbacks import (
    MetricsJsonlCallback,
    ProgressCallback,
    TensorBoardCallback,
    TrainerCallback,
)
from sampan.trainer.schedules import build_schedule
from sampan.trainer.state import TrainerState
from sampan.utils import hardware
from sampan.utils.hardware import process_memory_mb


class EvalPrediction(NamedTuple):
    """What ``compute_metrics`` receives: concatenated model outputs and labels of the eval set."""

    predictions: torch.Tensor
    label_ids: torch.Tensor


def _count_tokens(batch: Any) -> int:
    if isinstance(batch, dict):
        if "attention_mask" in batch:
            return int(batch["attention_mask"].sum())
        if "input_ids" in batch:
            return batch["input_ids"].numel()
        first = next(iter(batch.values()))
        return len(first)
    return len(batch[0] if isinstance(batch, (list, tuple)) else batch)


class Trainer:
    """Trains ``model`` on ``train_dataset`` as ``args`` say.

    Args:
        model: any ``torch.nn.Module`` whose ``forward(**batch)`` returns the loss (a scalar tensor,
            or a dict / object with ``loss``) when the batch holds labels. Sampan's models do.
        args: the run's ``TrainingArguments``.
        train_dataset: a map-style dataset (``len`` and ``__getitem__``).
        eval_dataset: optional map-style dataset for ``evaluate()``.
        data_collator: turns a list of samples into a batch (default: stack dict fields).
        compute_metrics: ``EvalPrediction -> dict`` of extra eval metrics (needs logits from
            ``model(**batch_without_labels)``).
        callbacks: extra ``TrainerCallback``s, after the built-in progress / jsonl / TensorBoard ones.

    ``backend`` is where the run happens (``make_backend(args)``: a fleet rank when
    ``args.strategy`` is set, else this process); ``model``, ``optimizer``, ``scaler`` and
    ``device`` are the backend's, after it placed / wrapped the model.
    """

    def __init__(
        self,
        model: nn.Module,
        args: TrainingArguments,
        train_dataset,
        eval_dataset=None,
        data_collator: Callable | None = None,
        compute_metrics: Callable[[EvalPrediction], dict[str, float]] | None = None,
        callbacks: list[TrainerCallback] | None = None,
    ):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(args, TrainingArguments):
            raise TypeError("args must be a sampan.trainer.TrainingArguments")
        self.model, self.args = model, args
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.data_collator = data_collator
        self.compute_metrics = compute_metrics
        self.output_dir = Path(args.output_dir)
        # With a strategy the run is one rank of a hybrid-parallel job (see backend.py, fleet_backend.py).
        self.backend: TrainingBackend = make_backend(args)
        # The backend resolved the device and what amp="auto" means on it: train with its copy.
        args = self.args = self.backend.args
        self.backend.check_compute_metrics(compute_metrics)
        self.is_main = self.backend.is_main
        data_world = self.backend.data_world_size
        self.jsonl = MetricsJsonlCallback(self.output_dir)
        builtin: list[TrainerCallback] = []
        if self.is_main:  # one rank reports for the job
            builtin = [ProgressCallback(), self.jsonl]
            if args.tensorboard:
                builtin.append(TensorBoardCallback(self.output_dir))
        self.callbacks = builtin + list(callbacks or [])
        self.state = TrainerState()
        if len(train_dataset) < args.per_device_train_batch_size * data_world:
            raise ValueError(f"train_dataset has {len(train_dataset)} samples, fewer than one batch of "
                             f"{args.per_device_train_batch_size} x {data_world} data-parallel ranks; lower "
                             "per_device_train_batch_size")
        lengths = None
        if args.group_by_length:
            lengths = getattr(train_dataset, "lengths", None)
            if lengths is None:
                raise ValueError(f"group_by_length needs a train dataset with a `lengths` attribute (one int per "
                                 f"sample); {type(train_dataset).__name__} has none: add it, or turn grouping off")
        self.train_loader = DataLoader(
            train_dataset, batch_size=args.per_device_train_batch_size, shuffle=True, drop_last=True,
            collate_fn=data_collator, num_workers=args.dataloader_num_workers,
            prefetch_factor=args.prefetch_factor, seed=args.seed, num_replicas=data_world,
            rank=self.backend.data_rank, lengths=lengths,
            pin_memory=self.backend.device.type == "cuda",  # with to_device's non-blocking copies
        )
        self.max_steps = args.max_steps if args.max_steps > 0 else max(1, math.ceil(
            args.num_train_epochs * len(self.train_loader) / args.gradient_accumulation_steps))
        self.state.max_steps = self.max_steps
        self.schedule = build_schedule(args, self.max_steps)
        self._flops_per_token = getattr(getattr(model, "config", None), "flops_per_token", None)
        self.backend.setup(model, self.schedule)  # the optimizer and loss scaler; recompute / splitting
        self.model, self.optimizer = self.backend.model, self.backend.optimizer
        self.scaler, self.device = self.backend.scaler, self.backend.device
        self._peak_flops: float | None = None
        self._last_lr = self.optimizer.get_lr()
        # Mixture-of-Experts: balancing figures for the log, the bias update once per step.
        self._moe = moe_logging.has_moe(self.model)
        self._moe_metrics: dict[str, float] = {}

    @property
    def fleet(self):
        """The ``FleetBackend`` of a run with a strategy, else None. Kept for scripts that ask
        whether to shut the process group down; the Trainer itself uses ``backend`` only."""
        return None if self.args.strategy is None else self.backend

    # -- overridable pieces -------------------------------------------------------------------
    def compute_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """Run the model on a batch and return the scalar loss."""
        out = model(**batch) if isinstance(batch, dict) else model(*batch)
        if isinstance(out, dict):
            out = out.get("loss")
        elif not isinstance(out, torch.Tensor):
            out = getattr(out, "loss", None)
        if not isinstance(out, torch.Tensor) or out.dim() != 0:
            raise ValueError("the model did not return a scalar loss: give the batch labels so it does, or "
                             "subclass Trainer and override compute_loss")
        return out

    def autocast(self):
        """The autocast context for forward passes (none in fp32)."""
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(self.args.amp or "")
        return auto_cast(enable=dtype is not None, dtype=dtype or "bfloat16", device_type=self.device.type)

    # -- checkpoints --------------------------------------------------------------------------
    def save(self) -> Path:
        """Write a checkpoint of the current step (atomic; rotated by ``save_total_limit``)."""
        trainer_state = {  # the backend adds the model, the optimizer and the RNG streams
            "state": self.state.to_dict(),
            "data": self.train_loader.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {},
            "args": self.args.to_dict(),
        }
        path = self.backend.save(self.output_dir, self.state.global_step, trainer_state,
                                 save_total_limit=self.args.save_total_limit)
        for cb in self.callbacks:
            cb.on_save(self.args, self.state, path)
        return path

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write the trained model, whole, with its ``save_pretrained`` (config.json + safetensors).

        With a strategy every rank calls it; rank 0 rebuilds the unsplit model from the newest
        checkpoint of this run (``train()`` always ends with one) and writes it.
        """
        checkpoint = self.output_dir / checkpoint_dir_name(self.state.global_step)
        return self.backend.save_pretrained(checkpoint, directory)

    def _resume(self) -> Path | None:
        path = resolve_resume(self.output_dir, self.args.resume_from_checkpoint)
        if path is None:
            return None
        saved = self.backend.load(path)  # model, optimizer, RNG streams
        self.state = TrainerState.from_dict(saved["state"])
        self.state.max_steps = self.max_steps
        if saved["scaler"] and self.scaler.is_enabled():
            self.scaler.load_state_dict(saved["scaler"])
        self.train_loader.load_state_dict(saved["data"])
        if self.is_main:
            self.jsonl.truncate_after(self.state.global_step)
        return path

    def _prepare_fresh_output_dir(self) -> None:
        """A fresh run must not mix with an earlier one left in ``output_dir``."""
        leftovers = [p for p in (*self.output_dir.glob("checkpoint-*"), self.jsonl.path,
                                 self.output_dir / "tensorboard") if p.exists()]
        if not leftovers:
            return
        if not self.args.overwrite_output_dir:
            raise ValueError(
                f"{self.output_dir} already holds a run ({', '.join(sorted(p.name for p in leftovers)[:4])}); set "
                "resume_from_checkpoint='auto' to continue it, overwrite_output_dir=True to start over, or use "
                "another output_dir")
        for path in leftovers:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()

    def _warn_mfu_over_one(self, achieved: float) -> None:
        """MFU over 100% is not clamped (the peak never moves with the run): it means the model's
        FLOP count or the peak is wrong, so say so once."""
        if self.is_main and not getattr(self, "_warned_mfu_over_one", False):
            self._warned_mfu_over_one = True
            if self.args.peak_flops:
                source = "TrainingArguments.peak_flops"
            elif self.device.type == "cpu":
                source = ("this processor's peak (sampan.utils.hardware.cpu_peak: FLOPs per cycle x cores x "
                          "clock, an upper bound that no load lowers)")
            else:
                source = "the device's datasheet peak"
            warnings.warn(f"MFU above 100%: training reached {achieved / 1e9:.1f} GFLOP/s against a peak of "
                          f"{self._peak_flops / 1e9:.1f} GFLOP/s from {source}; the model's FLOP count or that "
                          "peak is wrong", RuntimeWarning, stacklevel=3)

    @staticmethod
    def _warn_if_bf16_is_emulated() -> None:
        # CPUs without AVX512-BF16 / AMX run bf16 matmuls through a slow emulation (measured here:
        # 0.9 GFLOP/s bf16 against 55 fp32 on an AVX2-only EPYC), so bf16 AMP slows training down.
        bf16, fp32 = cpu_gemm_rates()  # the measurement amp="auto" decides by
        if bf16 < fp32:
            warnings.warn(
                f"amp='bf16' on a CPU without fast bf16 matmuls ({bf16 / 1e9:.1f} GFLOP/s bf16 vs "
                f"{fp32 / 1e9:.1f} fp32; CPU capability {torch.backends.cpu.get_cpu_capability()}): training will "
                "be slower than fp32; set amp=None", stacklevel=3)

    # -- the loop -----------------------------------------------------------------------------
    def _batches(self) -> Iterator[Any]:
        while True:
            yield from self.train_loader

    def _seed(self) -> None:
        random.seed(self.args.seed)
        np.random.seed(self.args.seed)
        torch.manual_seed(self.args.seed)

    def train(self) -> TrainerState:
        """Run (or resume) training to ``max_steps``, or until ``max_minutes`` is spent (then
        ``state.global_step < state.max_steps``); returns the final state."""
        args, model = self.args, self.model
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if args.deterministic:
            torch.use_deterministic_algorithms(True)
        self._seed()
        resumed = self._resume()
        if resumed is not None:
            if self.is_main:
                print(f"resumed from {resumed} at step {self.state.global_step}")
        elif self.is_main:
            self._prepare_fresh_output_dir()
        self.backend.barrier()  # no rank starts writing before rank 0 has cleared old runs away
        if self.device.type == "cpu" and args.amp == "bf16":
            self._warn_if_bf16_is_emulated()
        if self._flops_per_token is not None and args.peak_flops != 0:
            # A fixed peak for the run (datasheet on a GPU, the processor's SIMD x cores x clock
            # figure on the CPU, never timed); None (an unknown device) reports no MFU.
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp, torch.float32)
            self._peak_flops = args.peak_flops or hardware.device_peak_flops(self.device, dtype)
            if self._peak_flops:
                self._peak_flops = self.backend.job_peak_flops(self._peak_flops)  # MFU of the whole job
        for cb in self.callbacks:
            cb.on_train_begin(args, self.state)
        batches = self._batches()
        model.train()
        window = {"loss": [], "tokens": 0, "seconds": 0.0, "wait": 0.0, "flops": 0.0}
        last_saved = -1
        sitting_start = time.perf_counter()
        while self.state.global_step < self.max_steps:
            start, wait_before = time.perf_counter(), self.train_loader.wait_seconds
            loss, tokens, flops, grad_norm = self._train_step(batches)
            elapsed = time.perf_counter() - start
            self.state.train_seconds += elapsed
            self.state.tokens_seen += tokens
            self.state.epoch = self.train_loader.state_dict()["epoch"] + (
                self.train_loader.state_dict()["batch_index"] / len(self.train_loader))
            window["loss"].append(loss)
            window["tokens"] += tokens
            window["seconds"] += elapsed
            window["wait"] += self.train_loader.wait_seconds - wait_before
            window["flops"] += flops
            step = self.state.global_step
            for cb in self.callbacks:
                cb.on_step_end(args, self.state)
            if step % args.logging_steps == 0 or step == self.max_steps:
                self._log(window, grad_norm)
                window = {"loss": [], "tokens": 0, "seconds": 0.0, "wait": 0.0, "flops": 0.0}
            if self.eval_dataset is not None and args.eval_steps and step % args.eval_steps == 0:
                self.evaluate()
            if args.save_steps and step % args.save_steps == 0:
                self.save()
                last_saved = step
            if args.max_minutes and time.perf_counter() - sitting_start >= 60 * args.max_minutes:
                if step < self.max_steps and self.is_main:
                    print(f"stopping at step {step} of {self.max_steps}: this sitting's max_minutes "
                          f"({args.max_minutes:g}) is spent; resume_from_checkpoint='auto' continues the run")
                break  # the checkpoint below makes the stop resumable
        if self.eval_dataset is not None and not (args.eval_steps and self.state.global_step % args.eval_steps == 0):
            self.evaluate()
        if last_saved != self.state.global_step:
            self.save()
        for cb in self.callbacks:
            cb.on_train_end(args, self.state)
        return self.state

    def _train_step(self, batches: Iterator[Any]) -> tuple[float, int, float, float | None]:
        args, backend = self.args, self.backend
        micro = [to_device(next(batches), self.device) for _ in range(args.gradient_accumulation_steps)]
        tokens, flops = 0, 0.0
        for batch in micro:
            n = _count_tokens(batch)
            tokens += n
            if self._flops_per_token is not None and isinstance(batch, dict) and "input_ids" in batch:
                flops += self._flops_per_token(batch["input_ids"].shape[-1]) * n
        loss_value = backend.forward_backward(micro, self.compute_loss, self.autocast)
        tokens, flops = backend.job_totals(tokens, flops)  # report the job's throughput
        self.state.global_step += 1
        self._last_lr = self.optimizer.get_lr()  # the rate this step uses, logged (the schedule moves on below)
        step = self.state.global_step
        if self._moe and (step % args.logging_steps == 0 or step == self.max_steps):
            # Before the statistics are reset below; on every rank alike (a collective on fleet).
            self._moe_metrics = moe_logging.step_metrics(self.model)
        grad_norm = None
        if not math.isfinite(loss_value):
            # Skip the update: one bad batch must not poison the weights. Stop if it keeps happening.
            backend.zero_grad()
            if self._moe:
                moe_logging.end_step(self.model, stepped=False)
            self.state.skipped_steps += 1
            self.state.consecutive_nonfinite += 1
            if self.state.consecutive_nonfinite >= args.max_nonfinite_steps:
                raise FloatingPointError(
                    f"loss was non-finite for {self.state.consecutive_nonfinite} steps in a row (last at step "
                    f"{self.state.global_step}); lower learning_rate, keep max_grad_norm > 0, or use amp='bf16' "
                    "instead of 'fp16'"
                )
            return loss_value, tokens, flops, None
        self.state.consecutive_nonfinite = 0
        grad_norm = backend.clip_gradients()  # fp16 unscale first
        stepped = backend.optimizer_step()
        if stepped:
            self.schedule.step()
        else:  # the fp16 loss scaler skipped the update
            self.state.skipped_steps += 1
        backend.zero_grad()
        if self._moe:  # the aux-loss-free bias moves once per optimizer step
            moe_logging.end_step(self.model, stepped)
        return loss_value, tokens, flops, grad_norm

    def _log(self, window: dict[str, Any], grad_norm: float | None) -> None:
        seconds = max(window["seconds"], 1e-9)
        finite = [x for x in window["loss"] if math.isfinite(x)]
        remaining = self.max_steps - self.state.global_step
        metrics: dict[str, Any] = {
            "step": self.state.global_step,
            "max_steps": self.max_steps,
            "epoch": round(self.state.epoch, 4),
            "loss": sum(finite) / len(finite) if finite else float("nan"),
            "lr": self._last_lr,
            "grad_norm": grad_norm,
            "tokens_per_sec": window["tokens"] / seconds,
            "step_time_sec": seconds / len(window["loss"]),
            "data_wait_pct": 100.0 * window["wait"] / seconds,
            "memory_mb": process_memory_mb(),
            "skipped_steps": self.state.skipped_steps,
            "eta_sec": remaining * seconds / len(window["loss"]),
        }
        if self._peak_flops:
            achieved = window["flops"] / seconds
            if achieved > self._peak_flops:
                self._warn_mfu_over_one(achieved)
            metrics["mfu"] = achieved / self._peak_flops
        if self.scaler.is_enabled():
            metrics["loss_scale"] = self.scaler.get_scale()
        metrics.update(self._moe_metrics)  # the logged step's MoE balancing (moe_logging.step_metrics)
        for cb in self.callbacks:
            cb.on_log(self.args, self.state, metrics)

    @torch.no_grad()
    def evaluate(self, eval_dataset=None) -> dict[str, float]:
        """Mean loss (and ``compute_metrics``) over ``eval_dataset`` (default: the trainer's)."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs an eval_dataset (pass one to Trainer or to evaluate)")
        loss, predictions, labels = self.backend.eval_loss(
            dataset, self.data_collator, self.compute_loss, self.autocast, predict=self.compute_metrics is not None)
        metrics: dict[str, Any] = {"step": self.state.global_step, "eval_loss": loss}
        if self.compute_metrics is not None and predictions:
            extra = self.compute_metrics(EvalPrediction(torch.cat(predictions), torch.cat(labels)))
            metrics.update({f"eval_{k}" if not k.startswith("eval_") else k: v for k, v in extra.items()})
        return self._report_eval(metrics)

    def _report_eval(self, metrics: dict[str, Any]) -> dict[str, Any]:
        for cb in self.callbacks:
            cb.on_evaluate(self.args, self.state, metrics)
        return metrics

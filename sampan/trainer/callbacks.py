"""Trainer callbacks: progress display, ``metrics.jsonl``, TensorBoard.

A callback overrides any of the ``on_*`` hooks; the Trainer calls them in list order.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from sampan.trainer.arguments import TrainingArguments
from sampan.trainer.state import TrainerState
from sampan.utils.atomic import atomic_write


class TrainerCallback:
    """Base class: every hook is a no-op."""

    def on_train_begin(self, args: TrainingArguments, state: TrainerState) -> None: ...
    def on_log(self, args: TrainingArguments, state: TrainerState, metrics: dict[str, Any]) -> None: ...
    def on_evaluate(self, args: TrainingArguments, state: TrainerState, metrics: dict[str, Any]) -> None: ...
    def on_save(self, args: TrainingArguments, state: TrainerState, path: Path) -> None: ...
    def on_step_end(self, args: TrainingArguments, state: TrainerState) -> None: ...
    def on_train_end(self, args: TrainingArguments, state: TrainerState) -> None: ...


class MetricsJsonlCallback(TrainerCallback):
    """Appends every logged and evaluation record to ``output_dir/metrics.jsonl``, one JSON per line.

    On resume, records after the checkpoint's step are dropped first (they belong to steps that
    are about to be run again), so the file always tells one consistent history.
    """

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / "metrics.jsonl"

    def truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
        atomic_write(self.path, "".join(line + "\n" for line in kept))

    def _append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")

    def on_log(self, args, state, metrics):
        self._append({"kind": "train", **metrics})

    def on_evaluate(self, args, state, metrics):
        self._append({"kind": "eval", **metrics})


class TensorBoardCallback(TrainerCallback):
    """Writes scalars under ``output_dir/tensorboard`` (``train/loss``, ``train/lr``, ``eval/loss`` ...)."""

    def __init__(self, output_dir: str | os.PathLike):
        self.log_dir = Path(output_dir) / "tensorboard"
        self.writer = None

    def on_train_begin(self, args, state):
        # Opened here, not in __init__: a SummaryWriter creates its directory at once, and the
        # Trainer checks the output dir for an earlier run's leftovers before training starts.
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: keep it lazy

        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def _write(self, prefix: str, metrics: dict[str, Any]) -> None:
        if self.writer is None:
            return
        step = metrics["step"]
        for key, value in metrics.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"{prefix}/{key}", value, step)
        self.writer.flush()

    def on_log(self, args, state, metrics):
        self._write("train", metrics)

    def on_evaluate(self, args, state, metrics):
        self._write("eval", metrics)

    def on_train_end(self, args, state):
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _format(metrics: dict[str, Any]) -> str:
    parts = [f"step {metrics['step']:>6}/{metrics.get('max_steps', '?')}"]
    for key, fmt in (("loss", "loss {:.4f}"), ("eval_loss", "eval_loss {:.4f}"), ("lr", "lr {:.2e}"),
                     ("grad_norm", "grad_norm {:.3f}"), ("tokens_per_sec", "{:,.0f} tok/s"),
                     ("mfu", "MFU {:.1%}"), ("loss_scale", "scale {:.0f}"),
                     # Mixture-of-Experts balancing (the per-layer loads go to metrics.jsonl / TensorBoard)
                     ("moe/aux_loss", "aux {:.4f}"), ("moe/z_loss", "z {:.4f}"),
                     ("moe/load_max_over_mean", "load max/mean {:.2f}"), ("moe/dropped_tokens", "dropped {:.0f}"),
                     ("eta_sec", "ETA {}")):
        if metrics.get(key) is not None:
            value = metrics[key]
            if key == "eta_sec":
                value = time.strftime("%H:%M:%S", time.gmtime(value))
            parts.append(fmt.format(value))
    return "  ".join(parts)


class ProgressCallback(TrainerCallback):
    """A live rich progress bar on a terminal; a plain line per log step elsewhere (CI, pipes)."""

    def __init__(self, console=None):
        from rich.console import Console

        self.console = console or Console()
        self.progress = None
        self.task = None

    def on_train_begin(self, args, state):
        if args.progress_bar and self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                                     console=self.console, transient=False)
            self.task = self.progress.add_task("train", total=state.max_steps, completed=state.global_step, info="")
            self.progress.start()

    def on_step_end(self, args, state):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args, state, metrics):
        line = _format(metrics)
        if self.progress is not None:
            self.progress.update(self.task, info=line.split("  ", 1)[-1])
        else:
            self.console.print(line, highlight=False, soft_wrap=True)

    def on_evaluate(self, args, state, metrics):
        self.console.print(_format({"max_steps": state.max_steps, **metrics}), highlight=False, soft_wrap=True)

    def on_train_end(self, args, state):
        if self.progress is not None:
            self.progress.stop()

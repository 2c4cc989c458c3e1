"""``sampan report OUTPUT_DIR``: loss / learning-rate curves as a PNG and a summary table."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from sampan.utils.atomic import atomic_path


def read_metrics(output_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train_records, eval_records)`` from ``output_dir/metrics.jsonl``."""
    path = Path(output_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {output_dir} is not a Trainer output directory "
                                "(train with sampan.trainer.Trainer or `sampan train` first)")
    train, evals = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        (evals if record.get("kind") == "eval" else train).append(record)
    if not train and not evals:
        raise ValueError(f"{path} holds no metrics yet")
    return train, evals


def plot_curves(output_dir: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Write a PNG with the train / eval loss and the learning rate against steps."""
    import matplotlib

    matplotlib.use("Agg")  # no display here; never try to open a window
    import matplotlib.pyplot as plt

    train, evals = read_metrics(output_dir)
    out = Path(out) if out else Path(output_dir) / "report.png"
    fig, (ax_loss, ax_lr) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    if evals:
        ax_loss.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o-", label="eval loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title("loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend()
    if train:
        ax_lr.plot([r["step"] for r in train], [r["lr"] for r in train], color="tab:orange")
    ax_lr.set_xlabel("step")
    ax_lr.set_title("learning rate")
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(out) as tmp:  # tmp keeps out's name, so savefig picks the format from its suffix
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return out


def summarize(output_dir: str | os.PathLike) -> dict[str, Any]:
    """Headline figures of a run: steps, first / last / best losses, throughput, MFU."""
    train, evals = read_metrics(output_dir)
    finite = [r for r in train if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]
    summary: dict[str, Any] = {"steps": train[-1]["step"] if train else evals[-1]["step"]}
    if finite:
        summary.update(first_loss=finite[0]["loss"], last_loss=finite[-1]["loss"],
                       best_loss=min(r["loss"] for r in finite))
        speeds = [r["tokens_per_sec"] for r in finite if r.get("tokens_per_sec")]
        if speeds:
            summary["median_tokens_per_sec"] = sorted(speeds)[len(speeds) // 2]
        mfus = [r["mfu"] for r in finite if r.get("mfu") is not None]
        if mfus:
            summary["median_mfu"] = sorted(mfus)[len(mfus) // 2]
        summary["skipped_steps"] = train[-1].get("skipped_steps", 0)
    if evals:
        summary.update(last_eval_loss=evals[-1]["eval_loss"], best_eval_loss=min(r["eval_loss"] for r in evals))
    return summary

"""The demo's last stage: fine-tune the freshly pretrained ERNIE, export it, serve it through Taskflow.

pretrained ernie-tiny (stage 1) -> full fine-tuning on the deduplicated review split
-> ``jit.save`` export (ONNX + .pt2) -> ``Taskflow("sentiment_analysis", model=...)`` on the ONNX
predictor, with the held-out accuracy of every step printed. The demo's ERNIE has seen a few
hundred steps of one corpus, so its accuracy is far below the shipped model's; the point is the
path, and ``sampan hub build ernie-tiny-sentiment`` is the same path at full length.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class FinetuneStageConfig:
    """Fields: base (the pretrained model directory), out_dir, steps, batch_size, learning_rate,
    eval_examples (dev and test reviews scored), seed."""

    base: str
    out_dir: str
    steps: int = 150
    batch_size: int = 16
    learning_rate: float = 3e-4
    eval_examples: int = 600
    seed: int = 0


def run_finetune_stage(cfg: FinetuneStageConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tune, export, and run the Taskflow through the predictor; returns the figures."""
    from sampan.finetune import FinetuneConfig, finetune
    from sampan.taskflow import Taskflow

    out = Path(cfg.out_dir)
    log(f"finetune: review sentiment (deduplicated, leak-free split) from {cfg.base}, {cfg.steps} steps")
    result = finetune(FinetuneConfig(
        task="sentiment_analysis", model=cfg.base, method="full", max_steps=cfg.steps,
        batch_size=cfg.batch_size, learning_rate=cfg.learning_rate, seed=cfg.seed, output_dir=str(out / "model"),
        overwrite=True, max_eval_examples=cfg.eval_examples, eval_steps=max(cfg.steps // 3, 1)))
    log(f"finetune: held-out accuracy {result.metrics['accuracy']:.1%} on {cfg.eval_examples} test reviews; "
        f"trainable {result.trainable_parameters:,} of {result.total_parameters:,} parameters "
        f"({result.train_seconds:.0f} s)")

    start = time.perf_counter()
    # Taskflow exports the model on first use: jit.save -> ONNX + .pt2 (checked
    # against eager at several shapes), then opens the ONNX file in the predictor.
    flow = Taskflow("sentiment_analysis", model=str(result.output_dir))
    loaded = flow.task.loaded
    log(f"export: jit.save -> {loaded.inference_dir} (inference.onnx + inference.pt2, "
        f"{time.perf_counter() - start:.0f} s)")
    examples = ["这家餐厅的服务非常棒", "质量太差了，用了两天就坏"]
    answers = flow(examples)
    for row in answers:
        log(f"taskflow: {row}")
    log(f"taskflow: ran on {type(loaded.predictor).__name__} over {loaded.predictor.model_path}")
    return {"metrics": result.metrics, "trainable_parameters": result.trainable_parameters,
            "total_parameters": result.total_parameters, "export_dir": str(loaded.inference_dir),
            "answers": answers}

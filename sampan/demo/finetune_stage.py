"""The demo's last stage: fine-tune an ERNIE for review sentiment, export it, serve it through Taskflow.

By default the stage fine-tunes the **shipped** base ``ernie-tiny-zh`` (``base="shipped"``), the
same way ``sampan hub build ernie-tiny-sentiment`` does (embeddings and the first block frozen, which
also makes it faster) but for a few minutes, so the model a newcomer sees is not the weakest one.
``base="own"`` fine-tunes the stage-1 ERNIE instead; a demo-length ERNIE is often collapsed (it gives
the same output whatever its input, measured by ``output_similarity``), and then the stage also
fine-tunes the shipped base and serves the better of the two on dev.

Then: ``jit.save`` export (ONNX + .pt2); the char 1-3-gram TF-IDF + logistic regression is fitted
on the fine-tune's training split and attached to the served model with its weight picked on the
fine-tune's dev reviews (``sampan.hub.sentiment_ensemble.attach_ngram``, exactly as the shipped
ernie-tiny-sentiment is built), so ``Taskflow("sentiment_analysis", model=...)`` on the ONNX
predictor answers with the average of both in one call. One line prints the held-out accuracy of
that ensemble, of the ERNIE alone and of the TF-IDF + LR alone (the baseline), all on the
fine-tune's own test reviews. The served model answers a few clear reviews, and the shipped
``Taskflow("sentiment_analysis")`` answers the same reviews last.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from sampan.finetune.config import FinetuneConfig
from sampan.hub.sentiment_ensemble import NgramEnsembleConfig
from sampan.utils.config import nested, refuse_changes, resolve_nested

# Above this mean cosine between the encoder's outputs at different tokens, a pretrained ERNIE
# gives (nearly) the same output whatever its input, and fine-tuning it stays at chance.
COLLAPSED_COSINE = 0.95


# The stage's fine-tune where it differs from `sampan finetune`'s defaults: the shipped recipe's
# (ernie-tiny-sentiment: embeddings and the first block frozen, lr 3e-4) cut to 300 steps at batch
# 16, dev scored three times, 600 dev / test reviews.
FINETUNE_DEFAULTS = dict(task="sentiment_analysis", method="full", max_eval_examples=600,
                         freeze=("ernie.embeddings.word_embeddings", "ernie.embeddings.position_embeddings",
                                 "ernie.layers.0."),
                         training={"max_steps": 300, "per_device_train_batch_size": 16, "learning_rate": 3e-4,
                                   "eval_steps": 100, "overwrite_output_dir": True})
BASES = ("shipped", "own")
SHIPPED_BASE = "ernie-tiny-zh"
# Clear reviews the served model answers through Taskflow (the first is the seed's own example).
EXAMPLES = ("这家餐厅的服务非常棒", "质量太差了，用了两天就坏", "非常满意，下次还会再来", "太难吃了，再也不来了")


@dataclasses.dataclass
class FinetuneStageConfig:
    """The demo's sentiment stage: fine-tune an ERNIE, export it, serve it through Taskflow.

    Fields:
        base: "shipped" fine-tunes the shipped ernie-tiny-zh; "own" fine-tunes the ERNIE stage's model.
        finetune: the fine-tune (``sampan finetune``); its base is set by ``base`` and its output
            ``<stage dir>/model``.
        baseline: the char n-gram TF-IDF + logistic regression fitted on the fine-tune's training
            split: the baseline the line of figures compares with, and the half of the served model
            that is averaged with the ERNIE (weight picked on dev). ``enabled`` False serves the
            ERNIE alone and prints no baseline.
        compare_with_shipped: with base "own", when the stage-1 ERNIE is collapsed (it gives the same
            output whatever its input), also fine-tune the shipped ernie-tiny-zh the same way and
            serve the better of the two on dev.
        show_shipped: after the demo's own model answers, answer the same reviews with the shipped
            ``Taskflow("sentiment_analysis")`` too, each line labelled with its model and accuracy.
    """

    base: str = "shipped"
    finetune: FinetuneConfig = nested(FinetuneConfig, **FINETUNE_DEFAULTS)
    baseline: NgramEnsembleConfig = nested(NgramEnsembleConfig)
    compare_with_shipped: bool = True
    show_shipped: bool = True

    # Set by the stage itself: the base is the ERNIE stage's model, the output under the stage's directory.
    OWNED: ClassVar[dict[str, str]] = {"finetune.model": "set by the demo (--sentiment.base)",
                                       "finetune.training.output_dir": "set by the demo (<stage dir>/model)"}

    def __post_init__(self) -> None:
        resolve_nested(self)
        refuse_changes(self)
        if self.base not in BASES:
            raise ValueError(f"sentiment.base {self.base!r}: must be one of {list(BASES)} (\"shipped\" fine-tunes "
                             f"the shipped {SHIPPED_BASE}, \"own\" the ERNIE stage's model)")


def _finetune(cfg: FinetuneConfig, base: str, out: Path, log: Callable[[str], None]):
    from sampan.finetune import finetune

    result = finetune(dataclasses.replace(cfg, model=base,
                                          training=dataclasses.replace(cfg.training, output_dir=str(out))))
    log(f"finetune: held-out accuracy {result.metrics['accuracy']:.1%} on {result.data_sizes['test']} test "
        f"reviews (dev {result.dev_metrics['accuracy']:.1%}); trainable {result.trainable_parameters:,} of "
        f"{result.total_parameters:,} parameters ({result.train_seconds:.0f} s)")
    return result


def _task_data(cfg: FinetuneConfig):
    """The fine-tune's own splits: ``load_task_data`` with the fine-tune's arguments (its capped dev
    and test reviews included), so the n-gram model and the figures use the reviews it used."""
    from sampan.finetune.data import load_task_data

    return load_task_data(cfg.task, cfg.data, cfg.max_length, cfg.dev_fraction, cfg.training.seed,
                          cfg.max_train_examples, cfg.max_eval_examples, cfg.silver_corpora, cfg.silver_max_sentences)


def run_finetune_stage(cfg: FinetuneStageConfig, own_base: str, stage_dir: str | Path, collapsed: bool = False,
                       log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fine-tune the base ``cfg.base`` names (``own_base``: the ERNIE stage's model) under
    ``stage_dir``, export, and run the Taskflow through the predictor; returns the figures.
    ``collapsed``: ``own_base`` gives the same output whatever its input."""
    from sampan.store.models import resolve
    from sampan.taskflow import Taskflow

    out = Path(stage_dir)
    steps = cfg.finetune.training.max_steps
    shipped_base = str(resolve(SHIPPED_BASE))
    base = shipped_base if cfg.base == "shipped" else own_base
    log(f"finetune: review sentiment (deduplicated, leak-free split) from {base}, {steps} steps")
    result = own = _finetune(cfg.finetune, base, out / "model", log)
    if cfg.base == "own" and collapsed and cfg.compare_with_shipped:
        log(f"finetune: that ERNIE is collapsed, so no fine-tuning gets past chance from it; for comparison, "
            f"the same fine-tuning from the stored {SHIPPED_BASE} ({shipped_base})")
        reference = _finetune(cfg.finetune, shipped_base, out / "model-from-shipped-base", log)
        if reference.dev_metrics["accuracy"] > own.dev_metrics["accuracy"]:
            result = reference
            log("finetune: exporting and serving the model fine-tuned from the shipped base (better on dev)")
    figures = None
    if cfg.baseline.enabled:
        from sampan.hub.sentiment_ensemble import attach_ngram

        # The n-gram half of the served model, as the shipped recipe builds it, on the fine-tune's
        # own splits: the figures then come from the same test reviews as the fine-tune's.
        figures = attach_ngram(Path(result.output_dir), cfg.baseline, log, data=_task_data(cfg.finetune))
        accuracy = figures["test_accuracy"]
        log(f"held-out accuracy on the fine-tune's {figures['test_examples']} test reviews: sampan (ERNIE + n-gram, "
            f"weight {figures['ngram_weight']:.2f}) {accuracy:.3f}  ERNIE alone {figures['ernie_test_accuracy']:.3f}  "
            f"TF-IDF+LR baseline {figures['ngram_test_accuracy']:.3f}")
        what = "ERNIE + n-gram"
    else:
        accuracy = result.metrics["accuracy"]
        log(f"held-out accuracy on the fine-tune's {result.data_sizes['test']} test reviews: sampan {accuracy:.3f}")
        what = "ERNIE"

    start = time.perf_counter()
    # Opened after attach_ngram wrote the n-gram model and its weight beside the ERNIE, so one call
    # answers with the ensemble. Taskflow exports the model on first use: jit.save -> ONNX + .pt2
    # (checked against eager at several shapes), then opens the ONNX file in the predictor; the
    # export attach_ngram's scoring made is reused (the cache key leaves the ensemble entry out).
    flow = Taskflow("sentiment_analysis", model=str(result.output_dir))
    loaded = flow.task.loaded
    log(f"export: jit.save -> {loaded.inference_dir} (inference.onnx + inference.pt2, "
        f"{time.perf_counter() - start:.0f} s)")
    examples = list(EXAMPLES)
    answers = flow(examples)
    # Labelled as the demo's: a few minutes of training, not the shipped model.
    own_label = f"the demo's {steps}-step {what}, {accuracy:.1%} on held-out reviews"
    for row in answers:
        log(f"taskflow ({own_label}): {row}")
    log(f"taskflow: ran on {type(loaded.predictor).__name__} over {loaded.predictor.model_path}")
    shipped = _shipped_answers(examples, log) if cfg.show_shipped else None
    return {"metrics": result.metrics, "trainable_parameters": result.trainable_parameters,
            "total_parameters": result.total_parameters, "export_dir": str(loaded.inference_dir),
            "answers": answers, "own_base_metrics": own.metrics, "served": str(result.output_dir),
            "accuracy": accuracy, "ensemble": figures,
            "baseline_accuracy": figures["ngram_test_accuracy"] if figures else None,
            "test_examples": result.data_sizes["test"], "shipped_answers": shipped}


def _shipped_answers(examples: list[str], log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The same reviews through the shipped ``Taskflow("sentiment_analysis")`` (its model card's
    test accuracy beside it): the answer a user of sampan gets."""
    from sampan.store.models import ModelCard, resolve
    from sampan.taskflow import Taskflow

    flow = Taskflow("sentiment_analysis")
    metrics = ModelCard.read(resolve(flow.task.model_name)).metrics
    accuracy = metrics.get("test_accuracy")  # the shipped answer's: the ensemble's where there is one
    what = f"the shipped {flow.task.model_name}" + (f", {accuracy:.1%} on held-out reviews" if accuracy else "")
    answers = flow(examples)
    for row in answers:
        log(f"taskflow ({what}): {row}")
    return answers

"""``FinetuneResult``: what every fine-tuning task returns. It lives in its own module so the task
runners ``run.finetune`` dispatches to (``chat_sft``, ``dpo_train``) import it without importing
``run``, which imports them."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass
class FinetuneResult:
    """What a fine-tuning run produced.

    Fields:
        output_dir: the model directory (see ``load_task_model``).
        metrics: test-split metrics of the selected model (sentiment: ``accuracy``; ner: micro
            ``precision`` / ``recall`` / ``f1`` and ``PER_f1`` ... per type), plus ``loss``; chat:
            the dev split's ``loss`` (mean over assistant tokens) after training.
        dev_metrics: dev-split metrics of the selected (best dev) evaluation, with its ``step``.
        trainable_parameters: parameters that trained (LoRA / adapter / head for those methods).
        total_parameters: parameters of the model as trained (with LoRA / adapter modules).
        train_seconds: wall time of the training loop.
        initial_dev_metrics: dev-split metrics before the first step (the base with a fresh head).
        metrics_without_transitions: ner with ``tag_transitions``: the test metrics of the same
            weights decoded without the tag-bigram prior, to show what it is worth.
        labels: the label names in id order.
        data_sizes: examples per split after deduplication and sampling.
        load_report: how the base weights went into the task model.
    """

    output_dir: Path
    metrics: dict[str, float]
    dev_metrics: dict[str, float]
    trainable_parameters: int
    total_parameters: int
    train_seconds: float
    labels: list[str]
    data_sizes: dict[str, int]
    load_report: str
    initial_dev_metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    metrics_without_transitions: dict[str, float] = dataclasses.field(default_factory=dict)

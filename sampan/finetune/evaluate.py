"""Scoring a task model on examples: accuracy for sentiment, span P / R / F1 (character offsets) for ner.

Done here rather than through ``Trainer.evaluate(compute_metrics=...)``: that concatenates the
outputs of all batches, which token-level logits of different lengths cannot be, and it hands
``compute_metrics`` logits and label ids only, while span metrics need each example's text and
token offsets to score spans on characters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from sampan.finetune.data import TaskExample
from sampan.finetune.encoding import Encoded, PadCollator
from sampan.finetune.metrics import accuracy, flat_span_metrics, span_f1
from sampan.finetune.tags import IGNORE, decode_entities, tag_path


@torch.no_grad()
def predict_logits(model: torch.nn.Module, encoded: Sequence[Encoded], collator: PadCollator,
                   batch_size: int = 64) -> tuple[list[torch.Tensor], float]:
    """Logits per example (``[num_labels]`` or ``[tokens, num_labels]``) and the mean loss.

    Batches are formed from length-sorted examples (less padding); results come back in input order.
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i].input_ids))
    out: list[torch.Tensor | None] = [None] * len(encoded)
    device = next(model.parameters()).device
    total, count = 0.0, 0
    try:
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            batch = collator([encoded[i] for i in idx])
            labels = batch.pop("labels", None)
            logits = model(**{k: v.to(device) for k, v in batch.items()}).float().cpu()
            if labels is not None:
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                       ignore_index=IGNORE, reduction="sum")
                total += float(loss)
                count += int((labels != IGNORE).sum())
            for row, i in enumerate(idx):
                out[i] = logits[row] if logits.dim() == 2 else logits[row, : len(encoded[i].input_ids)]
    finally:
        model.train(was_training)
    return out, total / max(count, 1)


def score(task: str, examples: Sequence[TaskExample], encoded: Sequence[Encoded], logits: Sequence[torch.Tensor],
          labels: Sequence[str]) -> dict[str, float]:
    """Flat metrics: sentiment ``accuracy`` (+ ``examples``); ner micro ``precision`` / ``recall`` / ``f1``
    and per type ``PER_f1``, ``PER_precision``, ``PER_recall``, ``PER_support`` ..."""
    if task == "sentiment_analysis":
        gold = [enc.labels for enc in encoded]
        pred = [int(lg.argmax()) for lg in logits]
        return {"accuracy": accuracy(gold, pred), "examples": len(gold)}
    gold_spans = [list(ex.entities) for ex in examples]
    pred_spans = [decode_entities(ex.text, enc.offsets, tag_path(lg.numpy(), enc.offsets, labels), labels)
                  for ex, enc, lg in zip(examples, encoded, logits, strict=True)]
    return {**flat_span_metrics(span_f1(gold_spans, pred_spans)), "examples": len(examples)}


def evaluate_examples(model: torch.nn.Module, task: str, examples: Sequence[TaskExample],
                      encoded: Sequence[Encoded], labels: Sequence[str], collator: PadCollator,
                      batch_size: int = 64) -> dict[str, float]:
    """``score`` plus the mean ``loss`` of ``model`` on ``examples``."""
    logits, loss = predict_logits(model, encoded, collator, batch_size)
    return {"loss": loss, **score(task, examples, encoded, logits, labels)}


SELECTION_METRIC = {"sentiment_analysis": "accuracy", "ner": "f1"}

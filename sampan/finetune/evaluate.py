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
from sampan.finetune.tags import IGNORE, TagTransitions, count_transitions, decode_entities, tag_path
from sampan.utils.device import device_of


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
    device = device_of(model)
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
          labels: Sequence[str], transitions: TagTransitions | None = None) -> dict[str, float]:
    """Flat metrics: sentiment ``accuracy`` (+ ``examples``); ner micro ``precision`` / ``recall`` / ``f1``
    and per type ``PER_f1``, ``PER_precision``, ``PER_recall``, ``PER_support`` ... (ner spans are
    decoded with the ``transitions`` prior when given)."""
    if task == "sentiment_analysis":
        gold = [enc.labels for enc in encoded]
        pred = [int(lg.argmax()) for lg in logits]
        return {"accuracy": accuracy(gold, pred), "examples": len(gold)}
    gold_spans = [list(ex.entities) for ex in examples]
    pred_spans = [decode_entities(ex.text, enc.offsets, tag_path(lg.numpy(), enc.offsets, labels, transitions), labels)
                  for ex, enc, lg in zip(examples, encoded, logits, strict=True)]
    return {**flat_span_metrics(span_f1(gold_spans, pred_spans)), "examples": len(examples)}


def evaluate_examples(model: torch.nn.Module, task: str, examples: Sequence[TaskExample],
                      encoded: Sequence[Encoded], labels: Sequence[str], collator: PadCollator,
                      batch_size: int = 64, transitions: TagTransitions | None = None) -> dict[str, float]:
    """``score`` plus the mean ``loss`` of ``model`` on ``examples``."""
    logits, loss = predict_logits(model, encoded, collator, batch_size)
    return {"loss": loss, **score(task, examples, encoded, logits, labels, transitions)}


SELECTION_METRIC = {"sentiment_analysis": "accuracy", "ner": "f1"}

TRANSITION_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
"""The tag-bigram prior weights a fine-tune tries on the dev split (0 = the model's scores alone)."""


def choose_transitions(model: torch.nn.Module, train: Sequence[Encoded], dev: Sequence[TaskExample],
                       dev_encoded: Sequence[Encoded], labels: Sequence[str], collator: PadCollator,
                       weights: Sequence[float] = TRANSITION_WEIGHTS
                       ) -> tuple[TagTransitions, dict[float, dict[str, float]]]:
    """Count the tag-bigram prior on ``train``'s gold tags and pick its weight by dev span F1.

    Returns the prior at the chosen weight and the dev metrics at every weight tried (the first
    of equal scores wins, so with no gain the weight stays 0 and decoding is unchanged).
    """
    counted = count_transitions((enc.labels for enc in train), labels)
    logits, loss = predict_logits(model, dev_encoded, collator)
    by_weight = {float(w): {"loss": loss, **score("ner", dev, dev_encoded, logits, labels, counted.with_weight(w))}
                 for w in weights}
    best = max(by_weight, key=lambda w: (by_weight[w]["f1"], -w))
    return counted.with_weight(best), by_weight

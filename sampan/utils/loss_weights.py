"""How much each part of a batch weighs in a mean loss.

A model's loss is a mean over the terms of one batch (labelled tokens, or samples). When a step
is split into parts (micro-batches, data-parallel ranks), averaging the parts' means is wrong as
soon as they hold different numbers of terms (MLM masks, padding). Weighting each part's mean by
its term count gives exactly the mean over the whole step, as one big batch would.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def loss_token_count(model: nn.Module, batch: Any) -> float:
    """The number of terms ``model``'s mean loss averages on ``batch``.

    A sampan model says it itself (``loss_token_count(labels)``: e.g. GPT counts shifted
    labels); otherwise integer labels count their non-ignored (-100) entries, and anything else
    counts samples.
    """
    if isinstance(batch, dict):
        labels = batch.get("labels")
        counter = getattr(model, "loss_token_count", None)
        if isinstance(labels, torch.Tensor):
            if counter is not None:
                return float(counter(labels))
            if not labels.is_floating_point():
                return float((labels != -100).sum())
            return float(labels.shape[0])
        first = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
        return float(first.shape[0]) if first is not None else 1.0
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return float(batch[0].shape[0])
    return 1.0

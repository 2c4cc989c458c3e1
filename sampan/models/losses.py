"""The losses sampan's model heads compute, and how many terms each one averages.

A head's ``loss_token_count`` tells data-parallel and accumulated steps how to weight each part's
mean loss (``sampan.utils.loss_weights``), so the step equals one process on the global batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not ``ignore_index`` (computed in fp32)."""
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=ignore_index
    )


def next_token_loss(lm_head: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor, labels: torch.Tensor,
                    input_ids: torch.Tensor) -> torch.Tensor:
    """A causal LM's mean loss: position ``t`` predicts label ``t + 1`` (labels aligned with the input,
    usually a copy of it; -100 ignored). The last position predicts nothing, so the head never
    projects it."""
    if labels.shape != input_ids.shape:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal input_ids shape {tuple(input_ids.shape)}")
    return token_cross_entropy(lm_head(hidden[:, :-1]), labels[:, 1:])


def next_token_count(labels: torch.Tensor) -> torch.Tensor:
    """How many terms :func:`next_token_loss` averages for these labels (the shifted, non-ignored ones)."""
    return (labels[:, 1:] != -100).sum()


def labelled_count(labels: torch.Tensor) -> torch.Tensor:
    """How many terms a per-position loss averages (labels that are not -100)."""
    return (labels != -100).sum()

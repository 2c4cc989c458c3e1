"""Training-time augmentation of a letterboxed image tensor whose boxes must follow it."""

from __future__ import annotations

import random

import torch


def augment(image: torch.Tensor, boxes: torch.Tensor, rng: random.Random, flip: bool = False,
            colour: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """``image`` (3, h, w) in [0, 1] and ``boxes`` (n, 4) x0,y0,x1,y1: brightness/contrast jitter of
    up to ``colour`` (boxes unchanged) and, when ``flip`` (natural images; not for text pages, whose
    layout is not mirror-symmetric), a random horizontal flip that mirrors the boxes too."""
    if colour > 0:
        brightness = 1 + rng.uniform(-colour, colour)
        contrast = 1 + rng.uniform(-colour, colour)
        mean = image.mean()
        image = ((image - mean) * contrast + mean * brightness).clamp(0, 1)
    if flip and rng.random() < 0.5:
        width = image.shape[-1]
        image = image.flip(-1)
        boxes = torch.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], 1)
    return image, boxes

"""Letterbox: fit an image into the detector's square input keeping its aspect; boxes follow."""

from __future__ import annotations

import numpy as np
import torch

PAD = 114  # the grey the letterbox pads with (YOLO's and PicoDet's)


def letterbox_pixels(image, size: int) -> tuple[np.ndarray, float]:
    """``image`` (PIL) resized keeping its aspect so its long side is ``size``, padded bottom/right with
    grey: the ``(3, size, size)`` float32 array in [0, 1] the detector takes, and the scale. Numpy
    only, so the exported model's predictor prepares images exactly as the eager model does."""
    from PIL import Image

    scale = size / max(image.width, image.height)
    resized = image.convert("RGB").resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
    canvas = Image.new("RGB", (size, size), (PAD, PAD, PAD))
    canvas.paste(resized, (0, 0))
    return np.ascontiguousarray(np.asarray(canvas, np.float32).transpose(2, 0, 1) / 255.0), scale


def letterbox(image, boxes: list[list[float]], size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Resize ``image`` (PIL) keeping its aspect so its long side is ``size``, pad bottom/right with
    grey; boxes follow. Returns the ``(3, size, size)`` tensor in [0, 1], the boxes, and the scale."""
    pixels, scale = letterbox_pixels(image, size)
    return torch.from_numpy(pixels), torch.tensor(boxes, dtype=torch.float).view(-1, 4) * scale, scale

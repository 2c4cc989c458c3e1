"""Letterbox: fit an image into the detector's square input keeping its aspect; boxes follow."""

from __future__ import annotations

import torch


def letterbox(image, boxes: list[list[float]], size: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Resize ``image`` (PIL) keeping its aspect so its long side is ``size``, pad bottom/right with
    grey; boxes follow. Returns the ``(3, size, size)`` tensor in [0, 1], the boxes, and the scale."""
    from PIL import Image

    scale = size / max(image.width, image.height)
    resized = image.convert("RGB").resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
    canvas = Image.new("RGB", (size, size), (114, 114, 114))
    canvas.paste(resized, (0, 0))
    tensor = torch.frombuffer(bytearray(canvas.tobytes()), dtype=torch.uint8).view(size, size, 3).permute(2, 0, 1)
    return tensor.float() / 255.0, torch.tensor(boxes, dtype=torch.float).view(-1, 4) * scale, scale

"""Scanned-looking pages: a small skew (the boxes' corners move with the pixels, through
``sampan.vision.augment``), then blur, noise and JPEG; the boxes become the axis-aligned rectangles
around their moved corners, clipped to the image."""

from __future__ import annotations

import numpy as np
from PIL import Image

from sampan.vision.augment import AugmentConfig, augment
from sampan.vision.geometry import box_to_quad

# A scanner's degradations: a page laid a little askew, a little soft, grainy and compressed; no
# perspective (a flatbed holds the page flat).
SCAN_AUGMENT = AugmentConfig(rotate_prob=0.8, max_rotate_deg=2.0, perspective_prob=0.0, lowres_prob=0.2,
                             lowres_scale=(0.6, 0.9), blur_prob=0.5, max_blur=1.0, noise_prob=0.7, max_noise=10.0,
                             jpeg_prob=0.8, jpeg_quality=(35, 85))
SCANNER_BED = (226, 226, 222)  # what shows around a skewed page


def scan(image: Image.Image, boxes: list[list[float]], rng: np.random.Generator,
         config: AugmentConfig = SCAN_AUGMENT) -> tuple[Image.Image, list[list[float]], dict]:
    """Degrade ``image`` like a scan; returns the image, the boxes ``[x0, y0, x1, y1]`` moved with it,
    and the parameters applied."""
    corners = np.concatenate([box_to_quad(b) for b in boxes]) if boxes else np.zeros((0, 2))
    out, moved, applied = augment(image.convert("RGB"), corners, config, rng, fill=SCANNER_BED)
    w, h = out.size
    result = []
    for quad in moved.reshape(-1, 4, 2):
        x0, y0 = np.clip(quad.min(0), 0, [w, h])
        x1, y1 = np.clip(quad.max(0), 0, [w, h])
        result.append([float(x0), float(y0), float(x1), float(y1)])
    return out, result, applied

"""From a DB probability map to text boxes: binarise, connected components, minimum-area rectangle,
box score, unclip (undo the training shrink), filter, map back to the image, reading order."""

from __future__ import annotations

import dataclasses

import numpy as np

from sampan.vision import polygon as P
from sampan.vision.components import label


@dataclasses.dataclass
class DBPostProcessConfig:
    """Post-processing settings.

    Fields:
        thresh: probability above which a pixel is text.
        box_thresh: a box is kept when the mean probability inside it reaches this.
        max_candidates: at most this many components (the largest) are turned into boxes.
        shrink_ratio: the Vatti ratio the model was trained with (``DBTargetConfig.shrink_ratio``);
            with ``unclip_ratio=None`` the unclip inverts that shrink exactly.
        unclip_ratio: PaddleOCR's fixed expansion (offset ``area * ratio / perimeter``, 1.5 there);
            None inverts the shrink instead, which suits long Chinese lines better.
        min_size: boxes whose shorter side (in map pixels) is below this are dropped.
    """

    thresh: float = 0.3
    box_thresh: float = 0.6
    max_candidates: int = 1000
    shrink_ratio: float = 0.6
    unclip_ratio: float | None = None
    min_size: float = 3.0

    def __post_init__(self):
        if not 0.0 < self.thresh < 1.0 or not 0.0 <= self.box_thresh <= 1.0:
            raise ValueError(f"DBPostProcessConfig thresh must be in (0, 1) and box_thresh in [0, 1], got "
                             f"{self.thresh}, {self.box_thresh}")
        if self.max_candidates < 1:
            raise ValueError(f"DBPostProcessConfig.max_candidates must be >= 1, got {self.max_candidates}")
        if self.unclip_ratio is not None and self.unclip_ratio <= 0:
            raise ValueError(f"DBPostProcessConfig.unclip_ratio must be > 0 or None, got {self.unclip_ratio}")


@dataclasses.dataclass
class TextBox:
    """A detected text region.

    Fields:
        quad: ``(4, 2)`` corners in image pixels: top-left, top-right, bottom-right, bottom-left.
        score: mean text probability inside the (shrunk) box.
    """

    quad: np.ndarray
    score: float


def _component_points(component: np.ndarray, x0: int, y0: int) -> np.ndarray:
    """Corner points whose hull is the component's pixel area: each row's leftmost and rightmost
    pixel, both of their top and bottom corners (a hull of row extremes is the hull of all pixels)."""
    ys, xs = np.nonzero(component)
    rows = np.unique(ys)
    left = np.full(component.shape[0], np.iinfo(np.int64).max)
    right = np.full(component.shape[0], -1)
    np.minimum.at(left, ys, xs)
    np.maximum.at(right, ys, xs)
    lx, rx = left[rows] + x0, right[rows] + x0 + 1
    ty, by = rows + y0, rows + y0 + 1
    return np.concatenate([np.stack([lx, ty], 1), np.stack([lx, by], 1), np.stack([rx, ty], 1),
                           np.stack([rx, by], 1)]).astype(np.float64)


def _sides(rect: np.ndarray) -> tuple[float, float]:
    return float(np.linalg.norm(rect[1] - rect[0])), float(np.linalg.norm(rect[2] - rect[1]))


def _fit_area(rect: np.ndarray, pixels: float) -> np.ndarray | None:
    """Trim a rectangle fitted around pixel corners to the component's pixel area.

    The hull of pixel corners overshoots the true shape by up to a pixel on every side (more for a
    tilted band, whose staircase edges stick out), and the unclip multiplies a thin band's error
    about six-fold for a long line. The pixel count is the better measure of the area: take the
    common margin ``a`` with ``(w - a)(h - a) = pixels`` off the sides.
    """
    w, h = _sides(rect)
    s = w + h
    disc = s * s - 4.0 * (w * h - pixels)
    margin = (s - np.sqrt(max(disc, 0.0))) / 2.0
    if margin <= 1e-6:
        return rect
    return P.offset_convex(rect, -margin / 2.0)


def box_score(prob: np.ndarray, quad: np.ndarray) -> float:
    """Mean probability of the pixels whose centres lie inside ``quad``."""
    h, w = prob.shape
    x0, y0 = np.clip(np.floor(quad.min(axis=0)).astype(int), 0, [w, h])
    x1, y1 = np.clip(np.ceil(quad.max(axis=0)).astype(int), 0, [w, h])
    if x1 <= x0 or y1 <= y0:
        return 0.0
    inside = P.fill_mask(quad - [x0, y0], y1 - y0, x1 - x0)
    return float(prob[y0:y1, x0:x1][inside].mean()) if inside.any() else 0.0


def unclip(rect: np.ndarray, config: DBPostProcessConfig) -> np.ndarray | None:
    """Grow a shrunk rectangle back to the text's extent."""
    w, h = _sides(rect)
    if config.unclip_ratio is None:
        distance = P.unshrink_distance(w, h, config.shrink_ratio)
    else:
        distance = P.area(rect) * config.unclip_ratio / max(P.perimeter(rect), 1e-9)
    return P.offset_convex(rect, distance)


def boxes_from_map(prob: np.ndarray, config: DBPostProcessConfig | None = None,
                   scale: tuple[float, float] = (1.0, 1.0), image_size: tuple[int, int] | None = None
                   ) -> list[TextBox]:
    """Text boxes from one ``(H, W)`` probability map.

    ``scale`` = ``(sx, sy)`` maps map pixels to image pixels (the image was resized by ``1/s`` for the
    model); ``image_size`` = ``(height, width)`` clips the boxes to the image. Boxes come in reading
    order (:func:`reading_order`).
    """
    cfg = config or DBPostProcessConfig()
    prob = np.asarray(prob, dtype=np.float32)
    if prob.ndim != 2 or prob.size == 0:
        raise ValueError(f"boxes_from_map takes one non-empty (H, W) probability map, got shape {prob.shape}")
    labels, count = label(prob > cfg.thresh)
    if count == 0:
        return []
    sizes = np.bincount(labels.ravel(), minlength=count + 1)[1:]
    candidates = np.argsort(-sizes)[: cfg.max_candidates] + 1
    boxes: list[TextBox] = []
    for ident, sl in _slices(labels, candidates):
        component = labels[sl] == ident
        points = _component_points(component, sl[1].start, sl[0].start)
        rect = _fit_area(P.min_area_rect(points), float(component.sum()))
        if rect is None or min(_sides(rect)) < cfg.min_size:
            continue
        score = box_score(prob, rect)
        if score < cfg.box_thresh:
            continue
        grown = unclip(rect, cfg)
        if grown is None:
            continue
        quad = P.min_area_rect(grown)
        if min(_sides(quad)) < cfg.min_size + 2:
            continue
        quad = quad * np.asarray(scale, dtype=np.float64)
        if image_size is not None:
            quad = np.clip(quad, 0, [image_size[1], image_size[0]])
        boxes.append(TextBox(P.order_quad(quad).astype(np.float32), score))
    return reading_order(boxes)


def _slices(labels: np.ndarray, idents: np.ndarray):
    """``(ident, (row slice, column slice))`` of each wanted component's bounding box."""
    ys, xs = np.nonzero(labels)
    ids = labels[ys, xs]
    n = int(labels.max()) + 1
    y0, x0 = np.full(n, labels.shape[0]), np.full(n, labels.shape[1])
    y1, x1 = np.zeros(n, int), np.zeros(n, int)
    np.minimum.at(y0, ids, ys)
    np.minimum.at(x0, ids, xs)
    np.maximum.at(y1, ids, ys + 1)
    np.maximum.at(x1, ids, xs + 1)
    for i in idents:
        yield int(i), (slice(int(y0[i]), int(y1[i])), slice(int(x0[i]), int(x1[i])))


def reading_order(boxes: list[TextBox]) -> list[TextBox]:
    """Top to bottom, and left to right within a line: boxes whose vertical extents overlap by more
    than half the shorter one's height share a line."""
    remaining = sorted(boxes, key=lambda b: (float(b.quad[:, 1].min()), float(b.quad[:, 0].min())))
    ordered: list[TextBox] = []
    while remaining:
        first = remaining.pop(0)
        top, bottom = float(first.quad[:, 1].min()), float(first.quad[:, 1].max())
        line, rest = [first], []
        for box in remaining:
            t, b = float(box.quad[:, 1].min()), float(box.quad[:, 1].max())
            overlap = min(bottom, b) - max(top, t)
            (line if overlap > 0.5 * min(bottom - top, b - t) else rest).append(box)
        ordered += sorted(line, key=lambda b: float(b.quad[:, 0].min()))
        remaining = rest
    return ordered

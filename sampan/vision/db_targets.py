"""DB training targets from text quadrilaterals.

- probability target (``shrink_map``): each polygon shrunk inwards by the Vatti distance
  ``D = area (1 - r^2) / perimeter`` (r = ``shrink_ratio``, 0.6 by default), so neighbouring lines stay apart;
- ``shrink_mask``: 1 where the probability loss counts; 0 on polygons too small or thin to shrink
  (and on ``ignore`` ones), so they teach neither text nor background;
- threshold target (``threshold_map``): inside the polygon grown outwards by ``D``, ``1 - distance to
  the nearest edge / D`` (high on the border, falling off on both sides), scaled to
  ``[thresh_min, thresh_max]``; ``threshold_mask``: that grown polygon, where the L1 loss counts.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sampan.vision import polygon as P


@dataclasses.dataclass
class DBTargetConfig:
    """How DB targets are drawn.

    Fields:
        shrink_ratio: Vatti ratio r of the shrink. DB and PaddleOCR use 0.4; 0.6 here because at
            0.4 a 14-18 px line's band is ~2.6 px, under the post-processing's 3 px minimum, and 17%
            of such lines vanish even from a perfect map (benchmarks/ocr_db_geometry.py).
        thresh_min: threshold-map value away from any border.
        thresh_max: threshold-map value on a border.
        min_text_size: polygons whose shorter side is under this many pixels are ignored (mask 0).
    """

    shrink_ratio: float = 0.6
    thresh_min: float = 0.3
    thresh_max: float = 0.7
    min_text_size: float = 4.0

    def __post_init__(self):
        if not 0.0 < self.shrink_ratio < 1.0:
            raise ValueError(f"DBTargetConfig.shrink_ratio must be in (0, 1), got {self.shrink_ratio}")
        if not 0.0 <= self.thresh_min < self.thresh_max <= 1.0:
            raise ValueError(f"DBTargetConfig needs 0 <= thresh_min < thresh_max <= 1, got "
                             f"{self.thresh_min}, {self.thresh_max}")
        if self.min_text_size < 0:
            raise ValueError(f"DBTargetConfig.min_text_size must be >= 0, got {self.min_text_size}")


def _short_side(quad: np.ndarray) -> float:
    rect = P.min_area_rect(quad)
    return float(min(np.linalg.norm(rect[1] - rect[0]), np.linalg.norm(rect[2] - rect[1])))


def make_db_targets(quads, height: int, width: int, config: DBTargetConfig | None = None,
                    ignore=None) -> dict[str, np.ndarray]:
    """The four ``(height, width)`` float32 target maps for an image whose text lies in ``quads``
    (``(n, 4, 2)`` pixel corners, or any sequence of convex polygons); ``ignore[i]`` True marks a
    polygon to leave out of the loss (illegible text).

    Returns a dict with ``shrink_map``, ``shrink_mask``, ``threshold_map``, ``threshold_mask``.
    """
    cfg = config or DBTargetConfig()
    if height < 1 or width < 1:
        raise ValueError(f"make_db_targets needs a non-empty image, got {height}x{width}")
    shrink_map = np.zeros((height, width), np.float32)
    shrink_mask = np.ones((height, width), np.float32)
    dist_map = np.zeros((height, width), np.float32)  # 1 - normalised distance to the nearest border
    thresh_mask = np.zeros((height, width), np.float32)
    polys = [P.as_polygon(q) for q in quads]
    ignore = [False] * len(polys) if ignore is None else [bool(i) for i in ignore]
    if len(ignore) != len(polys):
        raise ValueError(f"ignore has {len(ignore)} flags for {len(polys)} polygons")
    for poly, skip in zip(polys, ignore, strict=True):
        shrunk = None
        if not skip and P.area(poly) > 1 and _short_side(poly) >= cfg.min_text_size:
            distance = P.shrink_distance(poly, cfg.shrink_ratio)
            shrunk = P.offset_convex(poly, -distance)
        if shrunk is None or P.area(shrunk) < 1:
            shrink_mask[P.fill_mask(poly, height, width)] = 0.0
            continue
        shrink_map[P.fill_mask(shrunk, height, width)] = 1.0
        _draw_border(poly, distance, dist_map, thresh_mask)
    threshold_map = dist_map * (cfg.thresh_max - cfg.thresh_min) + cfg.thresh_min
    return {"shrink_map": shrink_map, "shrink_mask": shrink_mask,
            "threshold_map": threshold_map.astype(np.float32), "threshold_mask": thresh_mask}


def _draw_border(poly: np.ndarray, distance: float, dist_map: np.ndarray, thresh_mask: np.ndarray) -> None:
    """Fill ``1 - d / D`` (d: distance to the polygon's nearest edge) over the polygon grown by D."""
    height, width = dist_map.shape
    grown = P.offset_convex(poly, distance)
    inside = P.fill_mask(grown, height, width)
    thresh_mask[inside] = 1.0
    ys, xs = np.nonzero(inside)
    if len(xs) == 0:
        return
    cx, cy = xs + 0.5, ys + 0.5
    nearest = np.min([P.segment_distance(cx, cy, a, b) for a, b in zip(poly, np.roll(poly, -1, axis=0), strict=True)],
                     axis=0)
    value = 1.0 - np.clip(nearest / max(distance, 1e-6), 0.0, 1.0)
    dist_map[ys, xs] = np.maximum(dist_map[ys, xs], value)  # neighbours' borders: keep the higher

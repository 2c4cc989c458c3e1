"""Polygon geometry in numpy for text detection: area, convex hull, minimum-area rectangle, offsetting
(the DB shrink and unclip), rasterising, IoU of convex polygons, corner order.

Coordinates are continuous pixels: pixel ``(x, y)`` covers ``[x, x+1) x [y, y+1)`` and its centre is
``(x + 0.5, y + 0.5)``; a polygon covers a pixel when it contains the pixel's centre.

Why not pyclipper / shapely: DB only ever offsets convex quadrilaterals (the labelled quads when
making targets, minimum-area rectangles when unclipping). Moving each edge of a convex polygon along
its normal and intersecting neighbouring edges is exact for those (Clipper's rounded corners are cut
off again by the minimum-area rectangle PaddleOCR takes next), so a dependency buys nothing here.
"""

from __future__ import annotations

import numpy as np


def as_polygon(points) -> np.ndarray:
    """``points`` as a float64 ``(n, 2)`` array; a clear error for anything else."""
    poly = np.asarray(points, dtype=np.float64)
    if poly.ndim != 2 or poly.shape[1] != 2 or poly.shape[0] < 3:
        raise ValueError(f"a polygon is an (n >= 3, 2) array of x, y points, got shape {poly.shape}")
    return poly


def signed_area(poly) -> float:
    """Shoelace area: positive when the points run clockwise on screen (y down), negative otherwise."""
    p = as_polygon(poly)
    x, y = p[:, 0], p[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def area(poly) -> float:
    """Area of a simple polygon."""
    return abs(signed_area(poly))


def perimeter(poly) -> float:
    """Length of the closed boundary."""
    p = as_polygon(poly)
    return float(np.linalg.norm(p - np.roll(p, -1, axis=0), axis=1).sum())


def _cross(a: np.ndarray, b: np.ndarray) -> float:
    return float(a[0] * b[1] - a[1] * b[0])


def convex_hull(points) -> np.ndarray:
    """Convex hull (Andrew's monotone chain), clockwise on screen; collinear points dropped."""
    pts = np.unique(np.asarray(points, dtype=np.float64).reshape(-1, 2), axis=0)  # sorted by x, then y
    if len(pts) < 3:
        return pts

    def half(seq):
        out: list = []
        for p in seq:
            while len(out) >= 2 and _cross(out[-1] - out[-2], p - out[-2]) <= 0:
                out.pop()
            out.append(p)
        return out

    lower, upper = half(pts), half(pts[::-1])
    hull = np.array(lower[:-1] + upper[:-1])
    return hull if signed_area(hull) >= 0 else hull[::-1]


def min_area_rect(points) -> np.ndarray:
    """The smallest rectangle around ``points`` as 4 corners ``(4, 2)`` (rotating calipers: the best
    rectangle has a side on a hull edge, so only the hull's edge directions are tried)."""
    hull = convex_hull(points)
    if len(hull) < 3:
        lo, hi = hull.min(axis=0), hull.max(axis=0)
        return np.array([[lo[0], lo[1]], [hi[0], lo[1]], [hi[0], hi[1]], [lo[0], hi[1]]])
    edges = np.roll(hull, -1, axis=0) - hull
    u = edges / np.linalg.norm(edges, axis=1, keepdims=True)  # (e, 2) edge directions
    v = np.stack([-u[:, 1], u[:, 0]], axis=1)  # their normals
    pu, pv = hull @ u.T, hull @ v.T  # (n, e) coordinates of every hull point in every edge's frame
    spans = (pu.max(0) - pu.min(0)) * (pv.max(0) - pv.min(0))
    i = int(np.argmin(spans))
    a0, a1, b0, b1 = pu[:, i].min(), pu[:, i].max(), pv[:, i].min(), pv[:, i].max()
    corners = np.array([[a0, b0], [a1, b0], [a1, b1], [a0, b1]])
    return order_quad(corners[:, :1] * u[i] + corners[:, 1:] * v[i])


def order_quad(quad) -> np.ndarray:
    """The 4 corners of a quadrilateral as top-left, top-right, bottom-right, bottom-left (clockwise
    on screen, starting from the corner nearest the top-left: smallest ``x + y``)."""
    q = as_polygon(quad)
    if len(q) != 4:
        raise ValueError(f"order_quad takes 4 points, got {len(q)}")
    centre = q.mean(axis=0)
    angles = np.arctan2(q[:, 1] - centre[1], q[:, 0] - centre[0])
    q = q[np.argsort(angles)]  # clockwise on screen (y down)
    start = int(np.argmin(q.sum(axis=1)))
    return np.roll(q, -start, axis=0)


def offset_convex(poly, distance: float) -> np.ndarray | None:
    """Move every edge of a convex polygon outwards by ``distance`` (inwards when negative) and return
    the polygon the moved edges bound, or None when shrinking makes it vanish or turn inside out."""
    p = as_polygon(poly)
    if signed_area(p) < 0:
        p = p[::-1]
    n = len(p)
    edges = np.roll(p, -1, axis=0) - p
    lengths = np.linalg.norm(edges, axis=1)
    keep = lengths > 1e-9
    p, edges, lengths = p[keep], edges[keep], lengths[keep]
    n = len(p)
    if n < 3:
        return None
    d = edges / lengths[:, None]
    normal = np.stack([d[:, 1], -d[:, 0]], axis=1)  # outward for a clockwise-on-screen polygon
    starts = p + distance * normal
    out = np.empty_like(p)
    for i in range(n):  # corner i joins edge i-1 and edge i
        a, da = starts[i - 1], d[i - 1]
        b, db = starts[i], d[i]
        den = da[0] * db[1] - da[1] * db[0]
        if abs(den) < 1e-12:  # parallel neighbours: the corner just moves along the normal
            out[i] = b
            continue
        t = ((b[0] - a[0]) * db[1] - (b[1] - a[1]) * db[0]) / den
        out[i] = a + t * da
    new_edges = np.roll(out, -1, axis=0) - out
    if distance < 0 and (np.einsum("ij,ij->i", new_edges, edges) <= 0).any():
        return None  # an edge reversed: the offset is larger than the polygon is thick
    return out


def shrink_distance(poly, ratio: float) -> float:
    """The Vatti shrink distance of DB: ``area * (1 - ratio**2) / perimeter``."""
    return area(poly) * (1.0 - ratio * ratio) / max(perimeter(poly), 1e-9)


def unshrink_distance(width: float, height: float, ratio: float) -> float:
    """The outward offset that undoes :func:`shrink_distance` exactly for a rectangle.

    A ``w' x h'`` rectangle shrunk from ``w x h`` by ``D = w h (1 - r^2) / (2 (w + h))`` with
    ``w = w' + 2D``, ``h = h' + 2D`` gives ``(8 - 4k) D^2 + 2 s (1 - k) D - k w' h' = 0``
    (``k = 1 - r^2``, ``s = w' + h'``); this is its positive root. PaddleOCR's fixed unclip ratio
    (1.5) undershoots long text lines, whose shrunk band is thin; this does not.
    """
    k, s = 1.0 - ratio * ratio, width + height
    a, b, c = 8.0 - 4.0 * k, 2.0 * s * (1.0 - k), -k * width * height
    return float((-b + np.sqrt(b * b - 4 * a * c)) / (2 * a))


def fill_mask(poly, height: int, width: int) -> np.ndarray:
    """A ``(height, width)`` bool mask of the pixels whose centres lie inside ``poly`` (even-odd rule,
    so any simple polygon works)."""
    p = as_polygon(poly)
    mask = np.zeros((height, width), dtype=bool)
    x0, y0 = np.floor(p.min(axis=0)).astype(int)
    x1, y1 = np.ceil(p.max(axis=0)).astype(int)
    x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, width), min(y1, height)
    if x1 <= x0 or y1 <= y0:
        return mask
    ys, xs = np.mgrid[y0:y1, x0:x1] + 0.5
    inside = np.zeros(xs.shape, dtype=bool)
    for (ax, ay), (bx, by) in zip(p, np.roll(p, -1, axis=0), strict=True):
        crosses = (ay > ys) != (by > ys)
        with np.errstate(divide="ignore", invalid="ignore"):
            at = ax + (ys - ay) * (bx - ax) / (by - ay)
        inside ^= crosses & (xs < at)
    mask[y0:y1, x0:x1] = inside
    return mask


def segment_distance(xs: np.ndarray, ys: np.ndarray, a, b) -> np.ndarray:
    """Distance from every point ``(xs, ys)`` to the segment ``a``-``b``."""
    ax, ay = a
    dx, dy = b[0] - ax, b[1] - ay
    length2 = max(dx * dx + dy * dy, 1e-12)
    t = np.clip(((xs - ax) * dx + (ys - ay) * dy) / length2, 0.0, 1.0)
    return np.hypot(xs - (ax + t * dx), ys - (ay + t * dy))


def _clip(subject: np.ndarray, clipper: np.ndarray) -> np.ndarray:
    """Sutherland-Hodgman: ``subject`` clipped to the convex, clockwise-on-screen ``clipper``."""
    out = subject
    for a, b in zip(clipper, np.roll(clipper, -1, axis=0), strict=True):
        if len(out) == 0:
            break
        edge = b - a
        side = edge[0] * (out[:, 1] - a[1]) - edge[1] * (out[:, 0] - a[0])  # >= 0: inside (clockwise)
        kept = []
        for i in range(len(out)):
            p, q, sp, sq = out[i - 1], out[i], side[i - 1], side[i]
            if sq >= 0:
                if sp < 0:
                    kept.append(p + (q - p) * (sp / (sp - sq)))
                kept.append(q)
            elif sp >= 0:
                kept.append(p + (q - p) * (sp / (sp - sq)))
        out = np.array(kept).reshape(-1, 2)
    return out


def convex_iou(a, b) -> float:
    """Intersection over union of two convex polygons."""
    pa, pb = as_polygon(a), as_polygon(b)
    pa = pa if signed_area(pa) >= 0 else pa[::-1]
    pb = pb if signed_area(pb) >= 0 else pb[::-1]
    inter = _clip(pa, pb)
    inter_area = area(inter) if len(inter) >= 3 else 0.0
    union = area(pa) + area(pb) - inter_area
    return inter_area / union if union > 0 else 0.0

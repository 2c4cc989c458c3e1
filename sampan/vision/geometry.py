"""Homographies that move an image and its boxes together, exactly.

Coordinates are continuous pixel coordinates: pixel (i, j) covers [i, i + 1) x [j, j + 1), the
convention of Pillow's ``getbbox`` and of its ``Image.transform``. A quadrilateral is a (4, 2) array
of corners, clockwise from the top left as the text reads. ``warp`` resamples the image through a
3 x 3 matrix and maps the points through the same matrix, so a box stays on its ink under rotation
and perspective: no re-fitting, no drift.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image


def box_to_quad(box) -> np.ndarray:
    """``(x0, y0, x1, y1)`` -> its four corners, clockwise from the top left."""
    x0, y0, x1, y1 = (float(v) for v in box)
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64)


def apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """``points`` (..., 2) mapped through the homography ``matrix``."""
    points = np.asarray(points, dtype=np.float64)
    flat = points.reshape(-1, 2)
    mapped = np.c_[flat, np.ones(len(flat))] @ matrix.T
    return (mapped[:, :2] / mapped[:, 2:3]).reshape(points.shape)


def translation(dx: float, dy: float) -> np.ndarray:
    return np.array([[1.0, 0.0, dx], [0.0, 1.0, dy], [0.0, 0.0, 1.0]])


def rotation(degrees: float, center: tuple[float, float]) -> np.ndarray:
    """Rotation by ``degrees`` about ``center``; positive turns the content counter-clockwise on screen."""
    t = math.radians(degrees)
    c, s = math.cos(t), math.sin(t)
    rot = np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])  # y points down, hence the signs
    return translation(*center) @ rot @ translation(-center[0], -center[1])


def perspective(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The homography taking the four points ``src`` to ``dst`` (each (4, 2))."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(np.asarray(src, float), np.asarray(dst, float), strict=True):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        rhs += [u, v]
    h = np.linalg.solve(np.array(rows), np.array(rhs))
    return np.append(h, 1.0).reshape(3, 3)


def warp(image: Image.Image, matrix: np.ndarray, points: np.ndarray | None = None, *, fill=0,
         expand: bool = True) -> tuple[Image.Image, np.ndarray | None, np.ndarray]:
    """Resample ``image`` through ``matrix`` (source -> destination) and map ``points`` the same way.

    With ``expand`` the output grows to hold the whole transformed image (a translation is folded
    into the matrix), so no box is clipped; ``fill`` paints what lies outside the source. Returns the
    image, the mapped points and the matrix actually applied (with that translation).
    """
    w, h = image.size
    if expand:
        corners = apply(matrix, box_to_quad((0, 0, w, h)))
        lo, hi = np.floor(corners.min(0)), np.ceil(corners.max(0))
        matrix = translation(-lo[0], -lo[1]) @ matrix
        size = (int(hi[0] - lo[0]), int(hi[1] - lo[1]))
    else:
        size = (w, h)
    inverse = np.linalg.inv(matrix)
    inverse = inverse / inverse[2, 2]
    # Pillow's PERSPECTIVE takes the destination -> source coefficients, row-major, last one implied.
    out = image.transform(size, Image.Transform.PERSPECTIVE, tuple(inverse.flatten()[:8]),
                          resample=Image.Resampling.BILINEAR, fillcolor=fill)
    return out, (None if points is None else apply(matrix, points)), matrix

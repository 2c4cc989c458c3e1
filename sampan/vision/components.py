"""Connected components of a binary map (8-connected), for DB post-processing.

``scipy.ndimage.label`` is used when scipy imports (it is not a sampan dependency, but most
environments have it); otherwise a numpy labelling of horizontal runs joined by union-find, which
gives the same components (numbered in another order).
"""

from __future__ import annotations

import numpy as np

try:  # optional: fast C labelling
    from scipy import ndimage as _ndimage
except ImportError:  # pragma: no cover - depends on the environment
    _ndimage = None


def label(bitmap: np.ndarray, use_scipy: bool = True) -> tuple[np.ndarray, int]:
    """``(labels, count)``: ``labels`` is an int32 map, 0 for background and ``1..count`` for the
    8-connected components of the True pixels of the 2-D ``bitmap``."""
    bitmap = np.asarray(bitmap, dtype=bool)
    if bitmap.ndim != 2:
        raise ValueError(f"label takes a 2-D bitmap, got shape {bitmap.shape}")
    if use_scipy and _ndimage is not None:
        labels, count = _ndimage.label(bitmap, structure=np.ones((3, 3), dtype=bool))
        return labels.astype(np.int32), int(count)
    return _label_runs(bitmap)


def _label_runs(bitmap: np.ndarray) -> tuple[np.ndarray, int]:
    h, w = bitmap.shape
    padded = np.zeros((h, w + 2), dtype=np.int8)
    padded[:, 1:-1] = bitmap
    diff = np.diff(padded, axis=1)
    rows_s, starts = np.nonzero(diff == 1)  # run [start, end) in row
    _, ends = np.nonzero(diff == -1)  # np.nonzero is row-major, so both lists pair up
    n = len(starts)
    labels = np.zeros((h, w), dtype=np.int32)
    if n == 0:
        return labels, 0
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    row_first = np.searchsorted(rows_s, np.arange(h + 1))  # runs of row r: row_first[r]:row_first[r+1]
    for r in range(1, h):
        prev = range(row_first[r - 1], row_first[r])
        j0 = row_first[r - 1]
        for i in range(row_first[r], row_first[r + 1]):
            # 8-connected: runs touch when they overlap after widening by one pixel
            while j0 < row_first[r] and ends[j0] < starts[i]:
                j0 += 1
            j = j0
            while j in prev and starts[j] <= ends[i]:
                a, b = find(i), find(j)
                if a != b:
                    parent[max(a, b)] = min(a, b)
                j += 1
    roots = np.array([find(i) for i in range(n)])
    _, ids = np.unique(roots, return_inverse=True)
    for i in range(n):
        labels[rows_s[i], starts[i]:ends[i]] = ids[i] + 1
    return labels, int(ids.max()) + 1

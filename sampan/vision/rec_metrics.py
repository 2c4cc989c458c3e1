"""Line-recognition figures: character accuracy (1 - normalised edit distance) and exact-line accuracy.

Character accuracy follows PaddleOCR's ``norm_edit_dis``: each line's Levenshtein distance divided
by the longer of prediction and reference, averaged over lines, subtracted from 1. So a line read
as nothing scores 0 for that line, and one extra character on a 10-character line costs 1/11.
"""

from __future__ import annotations

from collections.abc import Sequence


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (insertions, deletions and substitutions each cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def line_accuracy(predictions: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """``{"char_accuracy", "line_accuracy", "lines"}`` of ``predictions`` against ``references``."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not references:
        raise ValueError("no lines to score")
    normalised = [edit_distance(p, r) / max(len(p), len(r), 1) for p, r in zip(predictions, references, strict=True)]
    exact = sum(p == r for p, r in zip(predictions, references, strict=True))
    return {"char_accuracy": 1.0 - sum(normalised) / len(references), "line_accuracy": exact / len(references),
            "lines": float(len(references))}

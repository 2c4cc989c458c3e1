"""Line-recognition figures: character accuracy (1 - normalised edit distance) and exact-line accuracy.

Character accuracy follows PaddleOCR's ``norm_edit_dis``: each line's Levenshtein distance divided
by the longer of prediction and reference, averaged over lines, subtracted from 1. So a line read
as nothing scores 0 for that line, and one extra character on a 10-character line costs 1/11.
"""

from __future__ import annotations

from collections.abc import Sequence


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (unit costs), by Hyyrö's bit-parallel recurrence (Myers' algorithm for
    global distance): one column of the DP table is two bit vectors in a Python int, so a page of
    ~3,000 characters against another costs milliseconds rather than seconds."""
    if not a or not b:
        return len(a) + len(b)
    if len(a) > len(b):
        a, b = b, a
    m = len(a)
    masks: dict[str, int] = {}
    for i, ch in enumerate(a):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full, top = (1 << m) - 1, 1 << (m - 1)
    plus, minus, score = full, 0, m
    for ch in b:
        eq = masks.get(ch, 0)
        xv = eq | minus
        xh = (((eq & plus) + plus) ^ plus) | eq
        h_plus = minus | ~(xh | plus)
        h_minus = plus & xh
        if h_plus & top:
            score += 1
        elif h_minus & top:
            score -= 1
        h_plus = (h_plus << 1) | 1  # row 0 of the table grows by one per character of b
        h_minus <<= 1
        plus = (h_minus | ~(xv | h_plus)) & full
        minus = h_plus & xv & full
    return score


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

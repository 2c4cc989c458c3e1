"""How sure a difference in accuracy between two systems scored on the same examples is.

Two systems judged on one test set make correlated errors, so their accuracies' separate error bars
overstate the uncertainty of the difference. A paired bootstrap resamples *examples* (both systems'
verdicts on an example travel together) and reads the 2.5 / 97.5 percentiles of the difference;
the discordant counts (one right, the other wrong) are what McNemar's test would use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def paired_accuracy_difference(a_correct: Sequence[bool], b_correct: Sequence[bool], *,
                               resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Accuracy of ``a`` minus that of ``b`` on the same examples, with a 95% paired-bootstrap interval.

    Returns ``difference``, ``ci95`` ``[low, high]``, ``only_a_correct`` / ``only_b_correct`` (the
    discordant examples) and ``resamples``. An interval that contains 0 means the run cannot tell
    the two systems apart at that level.
    """
    a = np.asarray(a_correct, dtype=bool)
    b = np.asarray(b_correct, dtype=bool)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"need two equal-length, non-empty 1-d verdict lists, got shapes {a.shape} and {b.shape}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    diff = a.astype(np.int8) - b.astype(np.int8)  # +1, 0 or -1 per example
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, diff.size, size=(resamples, diff.size))
    means = diff[picks].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return {"difference": float(diff.mean()), "ci95": [float(low), float(high)],
            "only_a_correct": int((a & ~b).sum()), "only_b_correct": int((~a & b).sum()),
            "resamples": resamples}

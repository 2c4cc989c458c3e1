"""The OCR benchmark's scores: character and exact-line accuracy, detection precision / recall / F1 at
an IoU threshold, end-to-end page character accuracy, and paired-bootstrap intervals on differences.

Text is compared after :func:`normalise` (Unicode NFKC, so full- and half-width forms of a character
count as one, and all whitespace dropped: Tesseract's ``chi_sim`` puts a space between Chinese
characters, which says nothing about whether it read them). The strict scores (raw text, ends
stripped) are kept beside the normalised ones.

Character accuracy is over the whole set, not a mean of per-line rates: ``1 - sum(edits) /
sum(reference characters)``, edits being the Levenshtein distance (insertions, deletions and
substitutions, each 1). A long line weighs more than a short one, and a system that writes more
junk than there is text can go below 0.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np

from sampan.vision import polygon as P
from sampan.vision.rec_metrics import edit_distance


def normalise(text: str) -> str:
    """NFKC, whitespace removed (what the normalised scores compare)."""
    return "".join(unicodedata.normalize("NFKC", text).split())


def strict(text: str) -> str:
    """The text as written, its ends stripped (what the strict scores compare)."""
    return text.strip()


def line_errors(references: Sequence[str], hypotheses: Sequence[str], fold=normalise) -> dict[str, np.ndarray]:
    """Per line: ``edits``, ``lengths`` (reference characters) and ``exact`` (equal after ``fold``)."""
    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    refs = [fold(r) for r in references]
    hyps = [fold(h) for h in hypotheses]
    return {"edits": np.array([edit_distance(r, h) for r, h in zip(refs, hyps, strict=True)], dtype=np.int64),
            "lengths": np.array([len(r) for r in refs], dtype=np.int64),
            "exact": np.array([r == h for r, h in zip(refs, hyps, strict=True)], dtype=bool)}


def char_accuracy(edits: np.ndarray, lengths: np.ndarray) -> float:
    """``1 - sum(edits) / sum(lengths)``."""
    total = int(np.sum(lengths))
    if total == 0:
        raise ValueError("no reference characters to score against")
    return 1.0 - float(np.sum(edits)) / total


def line_scores(references: Sequence[str], hypotheses: Sequence[str]) -> dict[str, Any]:
    """Normalised and strict character accuracy and exact-line accuracy of ``hypotheses``."""
    norm = line_errors(references, hypotheses, normalise)
    raw = line_errors(references, hypotheses, strict)
    return {"lines": len(references), "reference_characters": int(norm["lengths"].sum()),
            "edits": int(norm["edits"].sum()),
            "char_accuracy": char_accuracy(norm["edits"], norm["lengths"]),
            "exact_line_accuracy": float(norm["exact"].mean()),
            "char_accuracy_strict": char_accuracy(raw["edits"], raw["lengths"]),
            "exact_line_accuracy_strict": float(raw["exact"].mean())}


def paired_char_accuracy_difference(edits_a: Sequence[int], edits_b: Sequence[int], lengths: Sequence[int], *,
                                    resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Character accuracy of ``a`` minus that of ``b`` on the same lines, with a 95% interval from a
    paired bootstrap over lines (a resampled line brings its reference length and both systems' edits)."""
    ea, eb, n = (np.asarray(x, dtype=np.float64) for x in (edits_a, edits_b, lengths))
    if not (ea.shape == eb.shape == n.shape) or ea.ndim != 1 or ea.size == 0:
        raise ValueError(f"need three equal-length, non-empty 1-d lists, got {ea.shape}, {eb.shape}, {n.shape}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    picks = np.random.default_rng(seed).integers(0, n.size, size=(resamples, n.size))
    total = n[picks].sum(axis=1)
    total[total == 0] = 1.0  # a resample of empty references only: both accuracies 1, difference 0
    diffs = (eb[picks].sum(axis=1) - ea[picks].sum(axis=1)) / total
    low, high = np.percentile(diffs, [2.5, 97.5])
    return {"difference": float((eb.sum() - ea.sum()) / n.sum()), "ci95": [float(low), float(high)],
            "resamples": resamples}


# -- pages ------------------------------------------------------------------------------------------
def _bounds(quad: np.ndarray) -> np.ndarray:
    return np.concatenate([quad.min(axis=0), quad.max(axis=0)])


def _convex(quad) -> np.ndarray:
    """The quad as a convex polygon (a detector may return a slightly bent one)."""
    return P.convex_hull(np.asarray(quad, dtype=np.float64).reshape(-1, 2))


def _area(poly: np.ndarray) -> float:
    return P.area(poly) if len(poly) >= 3 else 0.0


def iou_matrix(gold: Sequence, predicted: Sequence) -> np.ndarray:
    """IoU of every gold quad with every predicted one, ``(len(gold), len(predicted))``."""
    g = [_convex(q) for q in gold]
    p = [_convex(q) for q in predicted]
    out = np.zeros((len(g), len(p)))
    gb = [_bounds(q) for q in g]
    pb = [_bounds(q) for q in p]
    for i, (gq, (gx0, gy0, gx1, gy1)) in enumerate(zip(g, gb, strict=True)):
        for j, (pq, (px0, py0, px1, py1)) in enumerate(zip(p, pb, strict=True)):
            if px0 < gx1 and gx0 < px1 and py0 < gy1 and gy0 < py1 and len(gq) >= 3 and len(pq) >= 3:
                out[i, j] = P.convex_iou(gq, pq)
    return out


def match(ious: np.ndarray, threshold: float = 0.5) -> list[tuple[int, int]]:
    """One-to-one (gold, predicted) pairs with IoU >= ``threshold``, the highest IoU taken first."""
    pairs: list[tuple[int, int]] = []
    if ious.size == 0:
        return pairs
    used_g, used_p = set(), set()
    order = np.argsort(-ious, axis=None, kind="stable")
    for flat in order:
        i, j = np.unravel_index(flat, ious.shape)
        if ious[i, j] < threshold:
            break
        if i not in used_g and j not in used_p:
            pairs.append((int(i), int(j)))
            used_g.add(i)
            used_p.add(j)
    return pairs


def detection_scores(per_page: Sequence[tuple[int, int, int]]) -> dict[str, Any]:
    """Micro precision / recall / F1 from per-page ``(matched, gold, predicted)`` counts."""
    tp = sum(m for m, _, _ in per_page)
    gold = sum(g for _, g, _ in per_page)
    predicted = sum(p for _, _, p in per_page)
    precision = tp / predicted if predicted else 0.0
    recall = tp / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "matched": tp, "gold_lines": gold,
            "detected_boxes": predicted}


def page_text_errors(gold: Sequence[tuple[Any, str]], predicted: Sequence[tuple[Any, str]],
                     ious: np.ndarray | None = None) -> tuple[int, int]:
    """``(edits, reference characters)`` of one page, text matched to gold lines by box.

    Each predicted box goes to the gold line holding most of it (intersection over the box's own
    area, at least half; computed from the IoU as ``I = IoU (A + B) / (1 + IoU)``). A gold line's
    text is compared with its boxes' texts joined left to right (a line split in two reads whole);
    a gold line with no box costs its length (deletions), a box on no line its text (insertions).
    """
    ious = iou_matrix([q for q, _ in gold], [q for q, _ in predicted]) if ious is None else ious
    gold_area = np.array([_area(_convex(q)) for q, _ in gold])
    owner: dict[int, list[int]] = {i: [] for i in range(len(gold))}
    edits = 0
    for j, (quad, text) in enumerate(predicted):
        box_area = _area(_convex(quad))
        if len(gold) and box_area > 0:
            iou = ious[:, j]
            inter = iou * (gold_area + box_area) / (1.0 + iou)
            best = int(np.argmax(inter))
            if inter[best] >= 0.5 * box_area:
                owner[best].append(j)
                continue
        edits += len(normalise(text))  # a box on no gold line: every character it reads is an insertion
    reference = 0
    for i, (_, text) in enumerate(gold):
        ref = normalise(text)
        reference += len(ref)
        parts = sorted(owner[i], key=lambda j: float(np.asarray(predicted[j][0], dtype=np.float64)[:, 0].mean()))
        edits += edit_distance(ref, normalise("".join(predicted[j][1] for j in parts)))
    return edits, reference

"""Task metrics: accuracy, and exact-match entity span precision / recall / F1 on character offsets."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

SpanLike = tuple[int, int, str] | dict[str, Any]


def _span(s: SpanLike) -> tuple[int, int, str]:
    if isinstance(s, dict):
        return int(s["start"]), int(s["end"]), str(s["type"])
    start, end, kind = s
    return int(start), int(end), str(kind)


def _prf(tp: int, n_pred: int, n_gold: int) -> dict[str, float]:
    precision = tp / n_pred if n_pred else 0.0
    recall = tp / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "support": n_gold}


def span_f1(gold: Sequence[Iterable[SpanLike]], pred: Sequence[Iterable[SpanLike]]) -> dict[str, dict[str, float]]:
    """Exact-match span scores over a corpus.

    ``gold[i]`` and ``pred[i]`` are the spans of example ``i``: ``(start, end, type)`` tuples or
    ``{"start", "end", "type"}`` dicts (what ``decode_entities`` returns). A predicted span counts
    only when start, end and type all equal a gold span's. Returns ``{"micro": {...}, TYPE: {...}}``
    with precision, recall, f1 and support (gold count); a type never gold nor predicted is absent.
    """
    if len(gold) != len(pred):
        raise ValueError(f"span_f1 needs one prediction list per example: {len(gold)} gold, {len(pred)} predicted")
    tp: Counter[str] = Counter()
    n_gold: Counter[str] = Counter()
    n_pred: Counter[str] = Counter()
    for g, p in zip(gold, pred, strict=True):
        gs, ps = {_span(s) for s in g}, {_span(s) for s in p}
        for s in gs:
            n_gold[s[2]] += 1
        for s in ps:
            n_pred[s[2]] += 1
        for s in gs & ps:
            tp[s[2]] += 1
    out = {"micro": _prf(sum(tp.values()), sum(n_pred.values()), sum(n_gold.values()))}
    for kind in sorted(set(n_gold) | set(n_pred)):
        out[kind] = _prf(tp[kind], n_pred[kind], n_gold[kind])
    return out


def flat_span_metrics(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """``span_f1``'s nested result as flat scalars: ``precision``, ``recall``, ``f1`` (micro), ``PER_f1`` ..."""
    flat: dict[str, float] = {}
    for group, values in scores.items():
        prefix = "" if group == "micro" else f"{group}_"
        for key, value in values.items():
            flat[prefix + key] = value
    return flat


def accuracy(gold: Sequence[int], pred: Sequence[int]) -> float:
    """Share of equal entries."""
    if len(gold) != len(pred):
        raise ValueError(f"accuracy needs as many predictions as labels: {len(gold)} vs {len(pred)}")
    if not gold:
        raise ValueError("accuracy of an empty set is undefined")
    return sum(int(g) == int(p) for g, p in zip(gold, pred, strict=True)) / len(gold)

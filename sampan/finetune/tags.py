"""BIO tags over tokens, and back to character spans.

Each CJK character is one token (sampan's ChineseTokenizer), so on Chinese text a tag is a
character tag. Latin / digit runs become WordPiece tokens; a token takes the tag of the entity
its first character falls in (B- when it starts the entity, I- inside it). Special tokens
([CLS], [SEP], padding) carry no tag (-100, ignored by the loss).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

IGNORE = -100


def encode_bio(offsets: Sequence[tuple[int, int]], entities: Sequence[tuple[int, int, str]],
               labels: Sequence[str]) -> list[int]:
    """Tag ids for tokens with character ``offsets`` given gold ``entities`` ``(start, end, type)``.

    Tokens with an empty offset (special tokens) get -100. An entity type missing from ``labels``
    is an error naming it.
    """
    index = {label: i for i, label in enumerate(labels)}
    starts: dict[int, tuple[int, str]] = {}
    for start, end, kind in entities:
        if f"B-{kind}" not in index:
            raise ValueError(f"entity type {kind!r} has no tag in {list(labels)}")
        for pos in range(start, end):
            starts[pos] = (start, kind)
    out = []
    for start, end in offsets:
        if end <= start:
            out.append(IGNORE)
            continue
        hit = starts.get(start)
        if hit is None:
            out.append(index["O"])
        else:
            out.append(index[("B-" if hit[0] == start else "I-") + hit[1]])
    return out


def decode_entities(text: str, offsets: Sequence[tuple[int, int]], label_ids: Sequence[int],
                    labels: Sequence[str]) -> list[dict]:
    """Entity spans from per-token tag ids: ``[{"text", "type", "start", "end"}, ...]``.

    ``offsets`` are the tokens' character ranges in ``text`` (empty for special tokens, which are
    skipped). ``B-X`` opens a span; ``I-X`` continues an open ``X`` span, or opens one when none is
    open (a model may miss the B-); ``O`` or another type closes it. ``start`` / ``end`` are
    character offsets into ``text`` (end exclusive), so ``text[start:end] == span["text"]``.
    """
    if len(offsets) != len(label_ids):
        raise ValueError(f"{len(offsets)} offsets but {len(label_ids)} tag ids: give one tag per token")
    spans: list[dict] = []
    current: dict | None = None
    for (start, end), tag_id in zip(offsets, label_ids, strict=True):
        if end <= start:  # special token
            continue
        tag = labels[int(tag_id)] if 0 <= int(tag_id) < len(labels) else "O"
        prefix, _, kind = tag.partition("-")
        if prefix == "I" and current is not None and current["type"] == kind:
            current["end"] = end
            continue
        if current is not None:
            spans.append(current)
            current = None
        if prefix in ("B", "I"):
            current = {"type": kind, "start": start, "end": end}
    if current is not None:
        spans.append(current)
    return [{"text": text[s["start"]:s["end"]], "type": s["type"], "start": s["start"], "end": s["end"]}
            for s in spans]


def allowed_transitions(labels: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """BIO's grammar as masks: ``start[j]`` (tag j may open a sentence) and ``follow[i, j]`` (j may follow i).

    ``I-X`` may only follow ``B-X`` or ``I-X``; everything else is free. A label that is neither
    ``O`` nor ``B-`` / ``I-`` prefixed is an error naming it.
    """
    kinds = []
    for label in labels:
        prefix, _, kind = label.partition("-")
        if label != "O" and (prefix not in ("B", "I") or not kind):
            raise ValueError(f"label {label!r} is not BIO: use 'O', 'B-TYPE' or 'I-TYPE'")
        kinds.append((prefix if label != "O" else "O", kind))
    start = np.array([prefix != "I" for prefix, _ in kinds])
    follow = np.array([[nxt[0] != "I" or (prev[0] in ("B", "I") and prev[1] == nxt[1]) for nxt in kinds]
                       for prev in kinds])
    return start, follow


@dataclasses.dataclass(frozen=True)
class TagTransitions:
    """A tag-bigram prior for Viterbi: log P(first tag) and log P(next tag | tag), times ``weight``.

    A token classifier scores each token alone (its softmax sees the context, but not the tags
    chosen beside it), so it happily ends a person after its surname (``B-PER O`` for 斯大林) or
    tags a lone surname-like character. Counted on the training split's gold tags, the bigram
    prior says how rare those paths are; ``weight`` (picked on the dev split) sets how much it
    counts against the model's own scores. This is the transition half of a linear-chain CRF,
    estimated by counting rather than trained jointly with the encoder.
    """

    start: tuple[float, ...]
    follow: tuple[tuple[float, ...], ...]
    weight: float = 1.0

    def with_weight(self, weight: float) -> TagTransitions:
        return dataclasses.replace(self, weight=float(weight))

    @functools.cached_property
    def scaled(self) -> tuple[np.ndarray, np.ndarray]:
        """``weight * start`` and ``weight * follow`` as arrays, built once (Viterbi runs per sentence)."""
        return (self.weight * np.asarray(self.start, dtype=np.float64),
                self.weight * np.asarray(self.follow, dtype=np.float64))

    @classmethod
    def from_task_meta(cls, meta: dict[str, Any], labels: Sequence[str]) -> TagTransitions | None:
        """The prior a fine-tune stored in ``task.json`` (``tag_transitions``), or None when it has none."""
        stored = meta.get("tag_transitions")
        return cls.from_dict(stored, labels) if stored else None

    def to_dict(self) -> dict[str, Any]:
        return {"weight": self.weight, "start": [round(v, 6) for v in self.start],
                "follow": [[round(v, 6) for v in row] for row in self.follow]}

    @classmethod
    def from_dict(cls, data: dict[str, Any], labels: Sequence[str]) -> TagTransitions:
        """Read ``to_dict``'s form, checking it has one row / column per label."""
        n = len(labels)
        try:
            start = tuple(float(v) for v in data["start"])
            follow = tuple(tuple(float(v) for v in row) for row in data["follow"])
            weight = float(data.get("weight", 1.0))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"tag_transitions must hold 'start' ({n} numbers), 'follow' ({n} x {n}) and "
                             f"'weight': {exc}") from exc
        if len(start) != n or len(follow) != n or any(len(row) != n for row in follow):
            raise ValueError(f"tag_transitions has {len(start)} start scores and a {len(follow)}-row follow table "
                             f"for {n} labels {list(labels)}: re-run the fine-tune to rewrite it")
        return cls(start, follow, weight)


def count_transitions(tag_sequences: Iterable[Sequence[int]], labels: Sequence[str],
                      smoothing: float = 1.0) -> TagTransitions:
    """``TagTransitions`` (weight 1) from gold tag-id sequences; -100 entries (special tokens) are skipped.

    Add-``smoothing`` counts keep every bigram BIO allows possible; the ones it forbids are
    masked by Viterbi anyway.
    """
    n = len(labels)
    start = np.full(n, smoothing, dtype=np.float64)
    follow = np.full((n, n), smoothing, dtype=np.float64)
    for seq in tag_sequences:
        tags = [int(t) for t in seq if int(t) != IGNORE]
        if not tags:
            continue
        start[tags[0]] += 1
        np.add.at(follow, (tags[:-1], tags[1:]), 1)
    start = np.log(start / start.sum())
    follow = np.log(follow / follow.sum(axis=1, keepdims=True))
    return TagTransitions(tuple(start.tolist()), tuple(map(tuple, follow.tolist())), 1.0)


def viterbi_bio(scores, labels: Sequence[str], valid: Sequence[bool] | None = None,
                transitions: TagTransitions | None = None) -> list[int]:
    """The best tag sequence that obeys BIO, from per-token scores ``[tokens, labels]``.

    Arg-max tagging scores each token alone, so it can emit ``O I-LOC I-LOC`` (a span without its
    start) or ``B-PER I-LOC`` (a span that changes type); ``decode_entities`` then has to guess.
    Here the path maximising the summed log-probabilities (a log-softmax is taken over ``scores``,
    which may be raw logits) among the paths BIO allows is found by Viterbi, so boundaries are
    decided jointly. ``valid`` marks the tokens that carry tags (False for [CLS] / [SEP] /
    padding): the grammar runs over the valid tokens only, and the others get ``O``.
    ``transitions`` adds a tag-bigram prior (``TagTransitions``) to the path score.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 2 or scores.shape[1] != len(labels):
        raise ValueError(f"scores must be [tokens, {len(labels)}] (one column per label), got {list(scores.shape)}")
    keep = np.ones(len(scores), dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    if keep.shape != (len(scores),):
        raise ValueError(f"valid has {keep.shape[0] if keep.ndim else 0} entries for {len(scores)} tokens")
    out = np.full(len(scores), list(labels).index("O") if "O" in labels else 0, dtype=np.int64)
    rows = np.flatnonzero(keep)
    if not len(rows):
        return out.tolist()
    start, follow = allowed_transitions(labels)
    logp = scores[rows] - np.logaddexp.reduce(scores[rows], axis=1, keepdims=True)
    prior_start, prior_follow = np.zeros(len(labels)), np.zeros((len(labels), len(labels)))
    if transitions is not None and transitions.weight:
        prior_start, prior_follow = transitions.scaled
        if prior_follow.shape != (len(labels), len(labels)):
            raise ValueError(f"transitions are for {prior_follow.shape[0]} labels, the scores for {len(labels)}")
    penalty = np.where(follow, prior_follow, -np.inf)  # [prev, next]
    best = np.where(start, logp[0] + prior_start, -np.inf)
    back = np.zeros((len(rows), len(labels)), dtype=np.int64)
    for t in range(1, len(rows)):
        total = best[:, None] + penalty
        back[t] = total.argmax(axis=0)
        best = total[back[t], np.arange(len(labels))] + logp[t]
    path = [int(best.argmax())]
    for t in range(len(rows) - 1, 0, -1):
        path.append(int(back[t, path[-1]]))
    out[rows] = path[::-1]
    return out.tolist()


def tag_path(logits, offsets: Sequence[tuple[int, int]], labels: Sequence[str],
             transitions: TagTransitions | None = None) -> list[int]:
    """Tag ids for one example's token ``logits``: the best BIO-valid path over its real tokens
    (those with a non-empty character offset), with the ``transitions`` prior when given."""
    return viterbi_bio(logits, labels, [end > start for start, end in offsets], transitions)

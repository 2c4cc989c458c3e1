"""BIO tags over tokens, and back to character spans.

Each CJK character is one token (sampan's ChineseTokenizer), so on Chinese text a tag is a
character tag. Latin / digit runs become WordPiece tokens; a token takes the tag of the entity
its first character falls in (B- when it starts the entity, I- inside it). Special tokens
([CLS], [SEP], padding) carry no tag (-100, ignored by the loss).
"""

from __future__ import annotations

from collections.abc import Sequence

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

"""How a text becomes what an ERNIE encoder reads: sentence windows and ``[CLS] ... [SEP]`` ids.

One owner for both sides of a model: fine-tuning cuts its training texts with these functions and
Taskflow cuts its inputs with the same ones, so a model never sees text cut by another rule at
inference than it was trained on.

- ``sentence_windows``: a text as character ranges of whole sentences, a sentence longer than
  the window cut at a comma-like mark (never inside a gold entity when that can be avoided).
- ``encode_with_offsets``: ``[CLS] tokens [SEP]`` ids cut to ``max_length`` with each token's
  character offsets (``(0, 0)`` for the specials).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sampan.text.tokenizer import SEP_ID, ChineseTokenizer

Span = tuple[int, int, str]

_SENTENCE = re.compile(r"[^。！？!?；;\n]*(?:[。！？!?；;]+[”’」』\"'）)]*|\n|$)")
_SOFT_BREAKS = "，,、：: "


def _inside_entity(pos: int, entities: Sequence[Span]) -> bool:
    return any(s < pos < e for s, e, _ in entities)


def sentence_windows(text: str, max_chars: int, entities: Sequence[Span] = ()) -> list[tuple[int, int]]:
    """Cut ``text`` into sentences, and sentences longer than ``max_chars`` into windows.

    Returns ``(start, end)`` character ranges that cover every non-blank sentence, trimmed of
    blanks at both ends. A cut never falls inside one of ``entities`` (gold spans, when training)
    when it can be avoided; a window prefers to end after a comma-like mark.
    """
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    cuts = [0]
    for m in _SENTENCE.finditer(text):
        if m.end() > cuts[-1] and not _inside_entity(m.end(), entities):
            cuts.append(m.end())
    if cuts[-1] != len(text):
        cuts.append(len(text))
    ranges = []
    for start, end in zip(cuts, cuts[1:], strict=False):
        while end - start > max_chars:
            limit = start + max_chars
            candidates = [p for p in range(limit, start, -1) if not _inside_entity(p, entities)]
            soft = [p for p in candidates if text[p - 1] in _SOFT_BREAKS]
            cut = soft[0] if soft and soft[0] > start + max_chars // 2 else (candidates[0] if candidates else limit)
            ranges.append((start, cut))
            start = cut
        ranges.append((start, end))
    out = []
    for start, end in ranges:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end > start:
            out.append((start, end))
    return out


def encode_with_offsets(tokenizer: ChineseTokenizer, texts: Sequence[str],
                        max_length: int) -> list[tuple[list[int], list[tuple[int, int]], int]]:
    """Each text as ``(ids, offsets, tokens)``: ``[CLS] tokens [SEP]`` cut to ``max_length`` tokens
    (the last kept token is always ``[SEP]``), offsets into the text per token, and how many
    tokens the text had before the cut (specials included; more than ``max_length`` means cut)."""
    if max_length < 3:
        raise ValueError(f"max_length must be >= 3, got {max_length}")
    out = []
    for enc in tokenizer.encode_batch(list(texts)):
        ids, offsets = list(enc.ids), [tuple(o) for o in enc.offsets]
        tokens = len(ids)
        if tokens > max_length:
            ids = ids[: max_length - 1] + [SEP_ID]
            offsets = offsets[: max_length - 1] + [(0, 0)]
        out.append((ids, offsets, tokens))
    return out


__all__ = ["encode_with_offsets", "sentence_windows"]

"""Turning texts into the padded int64 arrays an exported ERNIE graph takes."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from sampan.text.tokenizer import PAD_ID, ChineseTokenizer


@dataclass
class EncodedBatch:
    """``input_ids`` / ``attention_mask`` ``int64[b, s]`` plus each row's character offsets.

    ``offsets[i][j]`` is the ``(start, end)`` of token ``j`` of row ``i`` in its text (``(0, 0)``
    for ``[CLS]`` / ``[SEP]``); ``lengths[i]`` counts row ``i``'s tokens, specials included.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    offsets: list[list[tuple[int, int]]]
    lengths: list[int]


class TruncationWarning(UserWarning):
    """A text was longer than the model's window and only its head was used (filter it with
    ``warnings.simplefilter("ignore", TruncationWarning)``, or count it, as benchmarks/tasks.py does)."""


def encode_texts(tokenizer: ChineseTokenizer, texts: list[str], max_length: int, *,
                 warn_truncation: bool = True) -> EncodedBatch:
    """Encode ``texts`` with ``[CLS] ... [SEP]``, truncated to ``max_length`` tokens, right-padded.

    A text longer than ``max_length`` is cut (its tail is not seen by the model) with a warning
    naming it, rather than failing: callers that must see every character (NER, segmentation)
    split texts into windows first (``windows``).
    """
    encodings = tokenizer.encode_batch(texts)
    rows, offsets = [], []
    for i, enc in enumerate(encodings):
        ids, offs = list(enc.ids), list(enc.offsets)
        if len(ids) > max_length:
            if warn_truncation:
                warnings.warn(f"text [{i}] has {len(ids) - 2} tokens; only the first {max_length - 2} are used "
                              f"(max_length={max_length})", TruncationWarning, stacklevel=3)
            ids = ids[: max_length - 1] + [ids[-1]]
            offs = offs[: max_length - 1] + [(0, 0)]
        rows.append(ids)
        offsets.append(offs)
    width = max(len(r) for r in rows)
    input_ids = np.full((len(rows), width), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = ids
        mask[i, : len(ids)] = 1
    return EncodedBatch(input_ids, mask, offsets, [len(r) for r in rows])


def windows(text: str, max_chars: int) -> list[tuple[int, int]]:
    """Split ``text`` into ``(start, end)`` pieces of at most ``max_chars`` characters, cutting
    after sentence punctuation where possible so an entity is rarely cut in two."""
    pieces, start = [], 0
    while start < len(text):
        end = min(start + max_chars, len(text))
        if end < len(text):
            cut = max(text.rfind(p, start, end) for p in "。！？；，,.!?;\n")
            if cut > start:
                end = cut + 1
        pieces.append((start, end))
        start = end
    return pieces

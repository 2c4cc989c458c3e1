"""Turning texts into the padded int64 arrays an exported ERNIE graph takes (ids and offsets from
``sampan.text.windows``, as in fine-tuning)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from sampan.text.tokenizer import PAD_ID, ChineseTokenizer
from sampan.text.windows import encode_with_offsets


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
    naming it, rather than failing: callers that must see every character (NER) split texts
    into sentence windows first (``sampan.text.windows.sentence_windows``, the rule fine-tuning
    cut the training texts by).
    """
    rows, offsets = [], []
    for i, (ids, offs, tokens) in enumerate(encode_with_offsets(tokenizer, texts, max_length)):
        if tokens > max_length and warn_truncation:
            warnings.warn(f"text [{i}] has {tokens - 2} tokens; only the first {max_length - 2} are used "
                          f"(max_length={max_length})", TruncationWarning, stacklevel=3)
        rows.append(ids)
        offsets.append(offs)
    width = max(len(r) for r in rows)
    input_ids = np.full((len(rows), width), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, ids in enumerate(rows):
        input_ids[i, : len(ids)] = ids
        mask[i, : len(ids)] = 1
    return EncodedBatch(input_ids, mask, offsets, [len(r) for r in rows])

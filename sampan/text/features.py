"""Chinese character features: tone-numbered pinyin, radical and stroke count, as ids per token.

ERNIE can add them as extra embeddings (``ErnieConfig.pinyin_vocab_size`` etc.; see
``sampan.nn.embeddings``): characters that sound alike or share a radical (江 河 湖 all carry 氵)
then start from related vectors. Features are per token and context-free: a polyphonic character
gets its most common reading (行 -> xing2), from pypinyin. Tokens that are not one CJK character
(Latin pieces, digits, punctuation, special tokens, ``[MASK]``) get id 0, "none": a masked
position must not leak the pinyin of the character it hides.

Computed once per vocabulary at data-build time and stored as ``features.json`` beside the shards.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sampan.utils.atomic import atomic_write

if TYPE_CHECKING:  # torch loads in lookup(): the tokenizer and Taskflow import this module without it
    import torch

FEATURE_NAMES = ("pinyin", "radical", "stroke")
# Stroke counts above this share the last id (the most complex common hanzi has 36).
MAX_STROKES = 63
_HANZI = re.compile(r"^[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]$")
_SYLLABLE = re.compile(r"^[a-z]+[1-5]$")


@lru_cache(maxsize=1)
def _radical_table():
    from cnradical import Radical, RunOption

    return Radical(RunOption.Radical)


def is_hanzi(ch: str) -> bool:
    """True for a single CJK ideograph."""
    return bool(_HANZI.match(ch))


def char_pinyin(ch: str) -> str | None:
    """Tone-numbered pinyin of a hanzi (江 -> "jiang1", neutral tone 5: 的 -> "de5"); None otherwise."""
    if not is_hanzi(ch):
        return None
    from pypinyin import Style, lazy_pinyin

    reading = lazy_pinyin(ch, style=Style.TONE3, neutral_tone_with_five=True)[0]
    return reading if _SYLLABLE.match(reading) else None


def char_radical(ch: str) -> str | None:
    """The radical of a hanzi (江 -> 氵), from cnradical; None when unknown or not a hanzi."""
    if not is_hanzi(ch):
        return None
    return _radical_table().trans_ch(ch) or None


def char_strokes(ch: str) -> int:
    """Stroke count of a hanzi (江 -> 6), from the strokes package; 0 when unknown or not a hanzi."""
    if not is_hanzi(ch):
        return 0
    from strokes import strokes

    return int(strokes(ch) or 0)


class CharFeatures:
    """Feature ids for every token id of a vocabulary.

    ``table[token_id] = (pinyin_id, radical_id, stroke_id)``; id 0 is "none" in each column.
    ``pinyin_vocab`` / ``radical_vocab`` list the strings behind the ids (index 0 is "").
    """

    def __init__(self, pinyin_vocab: Sequence[str], radical_vocab: Sequence[str], table: np.ndarray):
        table = np.asarray(table, dtype=np.int64)
        if table.ndim != 2 or table.shape[1] != 3:
            raise ValueError(f"feature table must have shape [vocab_size, 3], got {table.shape}")
        if list(pinyin_vocab[:1]) != [""] or list(radical_vocab[:1]) != [""]:
            raise ValueError("pinyin_vocab[0] and radical_vocab[0] must be '' (the 'none' id)")
        self.pinyin_vocab, self.radical_vocab = list(pinyin_vocab), list(radical_vocab)
        limits = (len(self.pinyin_vocab), len(self.radical_vocab), MAX_STROKES + 1)
        for column, (name, limit) in enumerate(zip(FEATURE_NAMES, limits, strict=True)):
            if table.size and (table[:, column].min() < 0 or table[:, column].max() >= limit):
                raise ValueError(f"{name} ids in the feature table must lie in [0, {limit})")
        self.table = table

    @classmethod
    def build(cls, tokens: Sequence[str]) -> CharFeatures:
        """Features of a vocabulary given as its tokens by id (``ChineseTokenizer.tokens()``)."""
        readings = [(char_pinyin(t), char_radical(t), char_strokes(t)) if len(t) == 1 else (None, None, 0)
                    for t in tokens]
        pinyin_vocab = [""] + sorted({p for p, _, _ in readings if p})
        radical_vocab = [""] + sorted({r for _, r, _ in readings if r})
        p_id = {p: i for i, p in enumerate(pinyin_vocab)}
        r_id = {r: i for i, r in enumerate(radical_vocab)}
        table = np.array([(p_id.get(p, 0) if p else 0, r_id.get(r, 0) if r else 0, min(s, MAX_STROKES))
                          for p, r, s in readings], dtype=np.int64).reshape(len(tokens), 3)
        return cls(pinyin_vocab, radical_vocab, table)

    def vocab_sizes(self) -> dict[str, int]:
        """``{"pinyin_vocab_size": ..., "radical_vocab_size": ..., "stroke_vocab_size": ...}`` for ErnieConfig."""
        return {"pinyin_vocab_size": len(self.pinyin_vocab), "radical_vocab_size": len(self.radical_vocab),
                "stroke_vocab_size": MAX_STROKES + 1}

    def lookup(self, input_ids: torch.Tensor, names: Sequence[str] = FEATURE_NAMES) -> dict[str, torch.Tensor]:
        """``{"pinyin_ids": ..., ...}`` shaped like ``input_ids``, for the features in ``names``."""
        unknown = set(names) - set(FEATURE_NAMES)
        if unknown:
            raise ValueError(f"unknown feature(s) {sorted(unknown)}; choose from {list(FEATURE_NAMES)}")
        import torch

        rows = torch.from_numpy(self.table)[input_ids]  # a view of the table, no copy
        return {f"{name}_ids": rows[..., FEATURE_NAMES.index(name)] for name in names}

    def describe(self, token_id: int) -> dict[str, object]:
        """Readable features of one token: ``{"pinyin": "jiang1", "radical": "氵", "strokes": 6}``."""
        p, r, s = (int(x) for x in self.table[token_id])
        return {"pinyin": self.pinyin_vocab[p] or None, "radical": self.radical_vocab[r] or None, "strokes": s}

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``features.json`` (atomically)."""
        data = {"type": "sampan-char-features", "pinyin_vocab": self.pinyin_vocab,
                "radical_vocab": self.radical_vocab, "table": self.table.tolist()}
        return atomic_write(path, json.dumps(data, ensure_ascii=False, separators=(",", ":")))

    @classmethod
    def load(cls, path: str | os.PathLike) -> CharFeatures:
        """Read a file written by :meth:`save`."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("type") != "sampan-char-features":
            raise ValueError(f"{path} is not a sampan features.json file")
        return cls(data["pinyin_vocab"], data["radical_vocab"], np.asarray(data["table"]).reshape(-1, 3))

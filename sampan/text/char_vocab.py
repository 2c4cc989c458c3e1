"""A character-level vocabulary: one id per character, for small models and demos.

Each CJK character is its own token (as in BERT-Chinese), so for Chinese this loses little
against a learned tokenizer; ``sampan.text.tokenizer`` (WordPiece via Hugging Face
``tokenizers``) is the general one.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from sampan.utils.atomic import atomic_write

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[EOS]")


class CharVocab:
    """Maps characters to ids and back. Ids 0, 1, 2 are ``[PAD]``, ``[UNK]``, ``[EOS]``."""

    def __init__(self, chars: Iterable[str]):
        tokens = list(SPECIAL_TOKENS) + [c for c in chars if c not in SPECIAL_TOKENS]
        if any(len(t) != 1 for t in tokens[len(SPECIAL_TOKENS):]):
            raise ValueError("CharVocab entries must be single characters")
        if len(set(tokens)) != len(tokens):
            raise ValueError("CharVocab entries must be unique")
        self.itos = tokens
        self.stoi = {t: i for i, t in enumerate(tokens)}

    pad_id, unk_id, eos_id = 0, 1, 2

    @classmethod
    def build(cls, texts: Iterable[str], min_freq: int = 1, max_size: int | None = None) -> CharVocab:
        """Vocabulary of characters seen at least ``min_freq`` times, most frequent first."""
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        counts = Counter()
        for text in texts:
            counts.update(text)
        ranked = sorted((c for c, n in counts.items() if n >= min_freq), key=lambda c: (-counts[c], c))
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(SPECIAL_TOKENS))]
        return cls(ranked)

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``'s characters; unknown characters become ``[UNK]``."""
        return [self.stoi.get(c, self.unk_id) for c in text]

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of ``ids``; special tokens are dropped unless ``skip_special=False``."""
        out = []
        for i in ids:
            token = self.itos[int(i)]
            if skip_special and token in SPECIAL_TOKENS:
                continue
            out.append(token)
        return "".join(out)

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as JSON (atomically: temp file, then rename)."""
        # Ranks of one job may save at once: each writes its own uniquely named temporary file.
        atomic_write(path, json.dumps({"type": "char", "tokens": self.itos}, ensure_ascii=False))

    @classmethod
    def load(cls, path: str | os.PathLike) -> CharVocab:
        """Read a vocabulary written by :meth:`save`."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("type") != "char" or list(data["tokens"][: len(SPECIAL_TOKENS)]) != list(SPECIAL_TOKENS):
            raise ValueError(f"{path} is not a sampan CharVocab file")
        return cls(data["tokens"][len(SPECIAL_TOKENS):])

"""CTC labels over a character set, and greedy decoding with per-character confidence.

Class 0 is the CTC blank; character ``charset[i]`` is class ``i + 1`` (PaddleOCR's layout).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

BLANK = 0


class CTCCodec:
    """Text to class ids and back for a fixed character set."""

    def __init__(self, charset: Sequence[str]):
        chars = list(charset)
        bad = [c for c in chars if len(c) != 1]
        if bad:
            raise ValueError(f"a charset holds single characters; got {bad[:5]}")
        if len(set(chars)) != len(chars):
            raise ValueError("the charset has repeated characters: each must have one class")
        if not chars:
            raise ValueError("the charset is empty")
        self.charset = chars
        self.index = {c: i + 1 for i, c in enumerate(chars)}

    @property
    def num_classes(self) -> int:
        """Characters + the blank."""
        return len(self.charset) + 1

    def encode(self, text: str) -> list[int]:
        """Class ids of ``text``; characters outside the charset are an error naming them."""
        missing = sorted({c for c in text if c not in self.index})
        if missing:
            raise ValueError(f"characters not in the charset: {missing[:10]} (drop the line, or rebuild the "
                             "charset with them)")
        return [self.index[c] for c in text]

    def encode_batch(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(targets, lengths)``: all texts' ids concatenated (what ``ctc_loss`` takes) and each length."""
        ids = [self.encode(t) for t in texts]
        flat = [i for seq in ids for i in seq]
        return torch.tensor(flat, dtype=torch.long), torch.tensor([len(s) for s in ids], dtype=torch.long)


@dataclasses.dataclass
class Recognition:
    """A decoded line.

    Fields:
        text: the characters read.
        char_scores: per character, the mean probability of its class over the frames it spans.
        score: the mean of ``char_scores`` (0.0 for an empty line).
    """

    text: str
    char_scores: list[float]
    score: float


def greedy_decode(probs: torch.Tensor | np.ndarray, charset: Sequence[str], lengths=None) -> list[Recognition]:
    """Best class per frame, repeats merged, blanks dropped.

    ``probs``: ``(N, T, C)`` class probabilities (softmax already applied; log-probabilities or
    logits would give meaningless scores but the same text). ``lengths``: valid frames per line
    (padding beyond them is ignored); default all ``T``.
    """
    p = probs.detach().float().cpu().numpy() if isinstance(probs, torch.Tensor) else np.asarray(probs, np.float32)
    if p.ndim != 3:
        raise ValueError(f"greedy_decode takes (N, T, C) probabilities, got shape {p.shape}")
    if p.shape[2] != len(charset) + 1:
        raise ValueError(f"greedy_decode got {p.shape[2]} classes for a charset of {len(charset)} (+1 blank)")
    n, t, _ = p.shape
    lengths = [t] * n if lengths is None else [int(v) for v in (lengths.tolist() if hasattr(lengths, "tolist")
                                                                  else lengths)]
    best, best_p = p.argmax(axis=2), p.max(axis=2)
    results = []
    for i in range(n):
        ids, scores = best[i, : lengths[i]], best_p[i, : lengths[i]]
        chars, char_scores = [], []
        start = 0
        while start < len(ids):
            end = start
            while end < len(ids) and ids[end] == ids[start]:
                end += 1  # one run of the same class is one emission
            if ids[start] != BLANK:
                chars.append(charset[ids[start] - 1])
                char_scores.append(float(scores[start:end].mean()))
            start = end
        results.append(Recognition("".join(chars), char_scores,
                                   float(np.mean(char_scores)) if char_scores else 0.0))
    return results

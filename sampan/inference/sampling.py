"""Logits -> next token, in numpy: the one sampling step of every deployed generation loop.

``sampan.inference.Generator`` and Taskflow's text and poetry generation sample here, so an exported
model generates without importing torch. The rules are those of eager ``generate``
(``sampan.models.generation``, which samples on the model's device in torch): CTRL's repetition
penalty, then temperature, then the ``top_k`` best and the ``top_p`` nucleus (the most likely token
always survives), then a draw from the softmax; ``tests/test_decode_graphs.py`` holds the two to the
same candidate sets and penalised logits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen.

    Fields:
        temperature: 0 picks the most likely token (greedy); above 0 samples from
            ``softmax(logits / temperature)``.
        top_k: sample among the ``top_k`` most likely tokens only (0: no limit).
        top_p: sample within the smallest set of most likely tokens whose probability reaches
            ``top_p`` (1.0: no limit).
        repetition_penalty: above 1 discourages tokens already in the sequence (prompt included):
            their positive logits are divided by it, negative ones multiplied (CTRL's rule).
        seed: the random generator's seed; the same seed, prompts and settings give the same
            tokens. None draws a fresh seed.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = no limit), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = none), got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def rng(self) -> np.random.Generator:
        """A numpy generator for one generation call, seeded by ``seed``."""
        return np.random.default_rng(self.seed)


def apply_repetition_penalty(logits: np.ndarray, history: Iterable[int], penalty: float) -> np.ndarray:
    """CTRL's penalty on a row ``logits [V]`` (in place): each token in ``history`` has a positive
    logit divided by ``penalty``, a negative one multiplied, once however often it occurred."""
    seen = np.unique(np.fromiter(history, dtype=np.int64))
    if penalty != 1.0 and seen.size:
        scores = logits[seen]
        logits[seen] = np.where(scores > 0, scores / penalty, scores * penalty)
    return logits


def filter_top_k_top_p(logits: np.ndarray, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """Set to -inf (in place) every logit of a row ``[V]`` outside the ``top_k`` best and outside
    the nucleus of probability ``top_p``; the most likely token always stays."""
    if top_k:
        k = min(top_k, int(np.isfinite(logits).sum()) or 1)
        kth = np.partition(logits, -k)[-k]
        logits[logits < kth] = -np.inf
    if top_p < 1.0:
        order = np.argsort(-logits, kind="stable")
        probs = softmax(logits[order])
        # Drop a token when the mass before it already reaches top_p (so the first always stays).
        drop = (np.cumsum(probs) - probs) >= top_p
        logits[order[drop]] = -np.inf
    return logits


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of a row of logits (``-inf`` -> 0)."""
    probs = np.exp(logits - logits.max())
    return probs / probs.sum()


def next_token(logits: np.ndarray, history: Iterable[int], params: SamplingParams, rng: np.random.Generator,
               *, banned: Iterable[int] = (), allowed: np.ndarray | None = None) -> int:
    """The next token of one row: ``logits [V]`` after the tokens ``history`` (prompt and output
    so far, for the repetition penalty). ``banned`` token ids and those where the boolean
    ``allowed [V]`` is False are never chosen. Greedy when ``params.temperature`` is 0 (``rng`` is
    not drawn from); otherwise one draw from ``rng``."""
    logits = np.array(logits, dtype=np.float64)
    apply_repetition_penalty(logits, history, params.repetition_penalty)
    banned = list(banned)
    if banned:
        logits[banned] = -np.inf
    if allowed is not None:
        logits[~allowed] = -np.inf
    if params.greedy:
        return int(np.argmax(logits))
    logits = filter_top_k_top_p(logits / params.temperature, params.top_k, params.top_p)
    probs = softmax(logits)
    return int(rng.choice(len(probs), p=probs))

"""ERNIE 1.0 knowledge masking: mask whole characters, phrases or entities within a 15% budget.

BERT masks single tokens, so 北京大[MASK] is guessed from 北京大 alone. ERNIE masks whole units
so the model has to know what the span means: at the **phrase** level a jieba word or idiom, at
the **entity** level a person, place or organisation name (see ``sampan.text.spans`` for how units
are found). Per sequence:

1. the units of the chosen level are shuffled and taken whole, skipping any that would overflow
   the budget, until ``mask_prob`` (15%) of the maskable tokens are covered;
2. each chosen unit is, as a whole, replaced by ``[MASK]`` (80%), by random tokens (10%) or kept
   (10%). Deciding per unit rather than per token keeps a half-masked name from giving itself away.

A ``MaskingSchedule`` stages the levels over training (ERNIE: char, then phrase, then entity).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sampan.text.spans import LEVEL_BITS, SPECIAL

MASK_LEVELS = tuple(LEVEL_BITS)  # ("char", "phrase", "entity")
IGNORE_INDEX = -100
# The three replacement actions of a chosen unit.
REPLACE_MASK, REPLACE_RANDOM, KEEP = 0, 1, 2


@dataclasses.dataclass
class MaskingConfig:
    """How much is masked and how masked units are replaced.

    Fields:
        mask_prob: fraction of maskable tokens (not [CLS] / [SEP] / [PAD]) chosen per sequence.
        mask_token_prob: share of chosen units replaced by ``[MASK]``.
        random_token_prob: share of chosen units replaced by random tokens; the rest are kept.
    """

    mask_prob: float = 0.15
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1

    def __post_init__(self) -> None:
        for name in ("mask_prob", "mask_token_prob", "random_token_prob"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"MaskingConfig.{name} must be in [0, 1], got {value}")
        if self.mask_prob == 0.0:
            raise ValueError("MaskingConfig.mask_prob must be > 0 (nothing would be predicted)")
        if self.mask_token_prob + self.random_token_prob > 1.0 + 1e-9:
            raise ValueError("MaskingConfig.mask_token_prob + random_token_prob must be <= 1, got "
                             f"{self.mask_token_prob} + {self.random_token_prob}")


@dataclasses.dataclass
class MaskingSchedule:
    """Which level masks at which point of training: ``stages`` of ``(level, fraction of steps)``.

    ``MaskingSchedule.parse("char:0.2,phrase:0.3,entity:0.5")``; fractions must sum to 1.
    """

    stages: tuple[tuple[str, float], ...] = (("char", 0.2), ("phrase", 0.3), ("entity", 0.5))

    def __post_init__(self) -> None:
        self.stages = tuple((str(level), float(share)) for level, share in self.stages)
        if not self.stages:
            raise ValueError("MaskingSchedule needs at least one stage")
        for level, share in self.stages:
            if level not in MASK_LEVELS:
                raise ValueError(f"masking level {level!r} is not one of {list(MASK_LEVELS)}")
            if share <= 0:
                raise ValueError(f"stage {level!r} must have a fraction > 0, got {share}")
        total = sum(share for _, share in self.stages)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"stage fractions must sum to 1, got {total:g} ({self.describe()})")

    # Named presets: "knowledge" is ERNIE's staged schedule; the others use one level throughout.
    PRESETS = ("knowledge", "char", "phrase", "entity")

    @classmethod
    def parse(cls, text: str) -> MaskingSchedule:
        """A preset name ("knowledge", "char", "phrase", "entity") or ``level:fraction,...``."""
        text = text.strip()
        if text == "knowledge":
            return cls()
        if text in MASK_LEVELS:
            return cls(((text, 1.0),))
        stages = []
        for part in text.split(","):
            level, sep, share = part.partition(":")
            try:
                stages.append((level.strip(), float(share)))
            except ValueError:
                sep = ""
            if not sep:
                raise ValueError(f"masking schedule {text!r}: each stage must look like level:fraction "
                                 f"(e.g. char:0.2,phrase:0.3,entity:0.5), or use one of {list(cls.PRESETS)}")
        return cls(tuple(stages))

    def level_at(self, step: int, max_steps: int) -> str:
        """The level for 0-based ``step`` of ``max_steps``."""
        position = step / max(max_steps, 1)
        done = 0.0
        for level, share in self.stages:
            done += share
            if position < done - 1e-12:
                return level
        return self.stages[-1][0]

    def describe(self) -> str:
        return ",".join(f"{level}:{share:g}" for level, share in self.stages)


def unit_ids(flags: np.ndarray, level: str) -> np.ndarray:
    """Per token of one sequence, the index of its unit at ``level`` (special tokens are units of their own)."""
    if level not in LEVEL_BITS:
        raise ValueError(f"masking level {level!r} is not one of {list(MASK_LEVELS)}")
    special = (flags & SPECIAL) != 0
    begins = ((flags & LEVEL_BITS[level]) != 0) | special
    begins[1:] |= special[:-1]  # a unit never continues across a special token
    if len(begins):
        begins[0] = True
    return np.cumsum(begins) - 1


class KnowledgeMasker:
    """Masks batches of token ids given their span flags.

    Args:
        vocab_size: random replacements are drawn from ``[first_random_id, vocab_size)``.
        mask_id: id of ``[MASK]``.
        config: budget and replacement shares.
        first_random_id: lowest id a random replacement may take (skips the special tokens).
    """

    def __init__(self, vocab_size: int, mask_id: int, config: MaskingConfig | None = None,
                 first_random_id: int = 5):
        if not 0 <= first_random_id < vocab_size:
            raise ValueError(f"first_random_id {first_random_id} must lie in [0, vocab_size={vocab_size})")
        self.vocab_size, self.mask_id, self.first_random_id = vocab_size, mask_id, first_random_id
        self.config = config or MaskingConfig()

    def choose_units(self, flags: np.ndarray, level: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``(unit id per token, chosen unit ids)`` for one sequence at ``level``."""
        units = unit_ids(flags, level)
        maskable = (flags & SPECIAL) == 0
        n = int(maskable.sum())
        if n == 0:
            return units, np.zeros(0, dtype=np.int64)
        budget = max(1, int(round(self.config.mask_prob * n)))
        lengths = np.bincount(units[maskable], minlength=int(units[-1]) + 1)
        candidates = np.flatnonzero(lengths)
        chosen, covered = [], 0
        for u in rng.permutation(candidates):
            size = int(lengths[u])
            if covered + size > budget:
                continue  # a whole unit or nothing: skip one that would overflow, try smaller ones
            chosen.append(u)
            covered += size
            if covered == budget:
                break
        return units, np.asarray(chosen, dtype=np.int64)

    def mask(self, input_ids: np.ndarray, flags: np.ndarray, level: str,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``(masked input_ids, labels)`` for ``[batch, seq]`` arrays; labels are -100 where not chosen."""
        ids = np.array(input_ids, dtype=np.int64, copy=True)
        flags = np.asarray(flags)
        if ids.shape != flags.shape or ids.ndim != 2:
            raise ValueError(f"input_ids {ids.shape} and flags {flags.shape} must both be [batch, seq]")
        labels = np.full_like(ids, IGNORE_INDEX)
        cfg = self.config
        for row in range(ids.shape[0]):
            units, chosen = self.choose_units(flags[row], level, rng)
            if not len(chosen):
                continue
            draw = rng.random(len(chosen))
            action = np.where(draw < cfg.mask_token_prob, REPLACE_MASK,
                              np.where(draw < cfg.mask_token_prob + cfg.random_token_prob, REPLACE_RANDOM, KEEP))
            per_unit = np.full(int(units[-1]) + 1, -1, dtype=np.int64)
            per_unit[chosen] = action
            token_action = per_unit[units]
            token_action[(flags[row] & SPECIAL) != 0] = -1
            picked = token_action >= 0
            labels[row, picked] = ids[row, picked]
            to_mask = token_action == REPLACE_MASK
            ids[row, to_mask] = self.mask_id
            to_random = token_action == REPLACE_RANDOM
            ids[row, to_random] = rng.integers(self.first_random_id, self.vocab_size, int(to_random.sum()))
        return ids, labels

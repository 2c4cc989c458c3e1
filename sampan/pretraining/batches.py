"""Turning unmasked rows + span flags into MLM batches (masked ids, labels, features)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from sampan.io import Dataset
from sampan.text.features import CharFeatures
from sampan.text.masking import KnowledgeMasker
from sampan.text.tokenizer import PAD_ID


class MLMBatcher:
    """Masks a batch at a level and adds ``labels``, ``attention_mask`` and feature ids.

    Feature ids are looked up on the *masked* ids, so a ``[MASK]`` carries no pinyin / radical /
    stroke of the character it hides.
    """

    def __init__(self, masker: KnowledgeMasker, features: CharFeatures | None = None,
                 feature_names: Sequence[str] = ()):
        if feature_names and features is None:
            raise ValueError("feature ids were asked for but no CharFeatures were given")
        self.masker, self.features, self.feature_names = masker, features, tuple(feature_names)

    def __call__(self, input_ids: np.ndarray, flags: np.ndarray, level: str,
                 rng: np.random.Generator) -> dict[str, torch.Tensor]:
        masked, labels = self.masker.mask(input_ids, flags, level, rng)
        return self.finish(input_ids, masked, labels)

    def finish(self, original: np.ndarray, masked: np.ndarray, labels: np.ndarray) -> dict[str, torch.Tensor]:
        """The model's batch for already-masked ids."""
        ids = torch.from_numpy(np.asarray(masked, dtype=np.int64))
        batch = {"input_ids": ids, "labels": torch.from_numpy(np.asarray(labels, dtype=np.int64)),
                 "attention_mask": torch.from_numpy(np.asarray(original) != PAD_ID)}
        if self.feature_names:
            batch.update(self.features.lookup(ids, self.feature_names))
        return batch


class MaskedEvalDataset(Dataset):
    """A fixed masking of (a subset of) a ``SpanShardDataset``: row ``i`` is always masked the same way.

    Every evaluation sees the same masked positions, so eval losses are comparable across steps
    and runs. ``rows`` picks at most that many rows, evenly spread over the split.
    """

    def __init__(self, base, batcher: MLMBatcher, level: str = "char", seed: int = 0, rows: int = 0):
        self.base, self.batcher, self.level, self.seed = base, batcher, level, seed
        n = len(base)
        self.indices = np.arange(n) if not rows or rows >= n else np.linspace(0, n - 1, rows).astype(np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids, flags = self.base.row(int(self.indices[i]))
        rng = np.random.default_rng([self.seed, int(self.indices[i])])
        batch = self.batcher(ids[None], flags[None], self.level, rng)
        return {k: v[0] for k, v in batch.items()}

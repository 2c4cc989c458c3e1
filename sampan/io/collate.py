"""Collate functions: turn a list of samples into one batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import default_collate

__all__ = ["collate_dicts", "default_collate"]


def collate_dicts(samples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack a list of ``{name: tensor}`` samples into ``{name: tensor[batch, ...]}``.

    Stricter than ``default_collate``: every sample must have the same keys and, per key, the
    same shape, and a mismatch is an error naming the key and the sample rather than torch's
    generic "stack expects each tensor to be equal size". Values that are not tensors (numpy
    arrays, Python numbers) are converted with ``torch.as_tensor``.
    """
    if len(samples) == 0:
        raise ValueError("collate_dicts got an empty list of samples")
    first = samples[0]
    if not isinstance(first, Mapping):
        raise TypeError(f"collate_dicts expects dict samples, got {type(first).__name__}")
    keys = list(first.keys())
    batch: dict[str, torch.Tensor] = {}
    for i, sample in enumerate(samples):
        if not isinstance(sample, Mapping) or set(sample.keys()) != set(keys):
            got = sorted(sample.keys()) if isinstance(sample, Mapping) else type(sample).__name__
            raise ValueError(f"sample {i} has keys {got}, but sample 0 has {sorted(keys)}")
    for key in keys:
        values = [torch.as_tensor(sample[key]) for sample in samples]
        shape = values[0].shape
        for i, value in enumerate(values):
            if value.shape != shape:
                raise ValueError(
                    f"cannot stack key {key!r}: sample {i} has shape {tuple(value.shape)}, "
                    f"sample 0 has {tuple(shape)} (pad to a common length first)"
                )
        batch[key] = torch.stack(values)
    return batch

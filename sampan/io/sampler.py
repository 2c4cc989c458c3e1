"""Samplers whose order is a pure function of (seed, epoch), so a run can resume at any batch.

Sharding rule (data parallel), used by :class:`ResumableBatchSampler`:

1. Every rank computes the same epoch order: ``epoch_order(n, seed, epoch, shuffle)``.
2. The order is cut into *global batches* of ``G = batch_size * num_replicas`` consecutive
   indices: global batch ``b`` is ``order[b*G : (b+1)*G]``.
3. Rank ``r`` takes the contiguous slice ``global[r*batch_size : (r+1)*batch_size]``.

So concatenating the ranks' batches (rank 0 first) gives the global batch, which is exactly the
batch a single-replica loader with ``batch_size=G`` yields: the data a step sees depends on the
global batch size only, never on how it is split over ranks.

The last global batch, when ``n`` is not a multiple of ``G``:

* ``drop_last=True``: it is dropped (on every rank, so all ranks run the same number of steps).
* ``drop_last=False``: with ``m`` samples left, each rank gets ``k = ceil(m / num_replicas)``;
  the batch is padded to ``k * num_replicas`` by repeating the epoch order from its start (as
  ``torch.utils.data.DistributedSampler`` does), so no rank is left without data and collectives
  see equal shapes. With one replica there is no padding: the last batch is just shorter.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import Sampler

__all__ = ["ResumableBatchSampler", "ResumableSampler", "epoch_order", "group_by_length"]


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The order of sample indices for one epoch, as an int64 tensor.

    ``shuffle=True``: ``torch.randperm(num_samples)`` drawn from a private generator seeded with
    ``seed + epoch`` (a private generator, so the global torch RNG, which drives dropout and
    init, is never touched: drawing data order must not change the model's random stream).
    ``shuffle=False``: ``0 .. num_samples - 1``.
    """
    if not shuffle:
        return torch.arange(num_samples, dtype=torch.int64)
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator)


def group_by_length(order: torch.Tensor, lengths: torch.Tensor, group_size: int, window: int,
                    seed: int, epoch: int) -> torch.Tensor:
    """Reorder an epoch ``order`` so that each run of ``group_size`` indices has similar lengths.

    The order is cut into windows of ``window * group_size`` indices; each window is sorted by
    length (longest first, ties in order) and cut into groups of ``group_size``, whose order
    within the window is then shuffled (seeded by ``seed + epoch``). A batch made of one group
    pads to a length its samples nearly share, instead of to the longest of a random draw (about
    half of a random batch of reviews or news sentences is padding). Batches stay random at the
    scale of a window, as Hugging Face's ``group_by_length`` keeps them. A pure function of its
    arguments, so resuming still is index arithmetic.
    """
    span = window * group_size
    generator = torch.Generator().manual_seed(seed + epoch + 7919)  # not the epoch order's stream
    parts = []
    for start in range(0, len(order), span):
        chunk = order[start:start + span]
        chunk = chunk[torch.sort(-lengths[chunk], stable=True).indices]
        groups = list(torch.split(chunk, group_size))
        full = len(groups) - (1 if len(groups[-1]) < group_size else 0)  # a short group stays last
        shuffled = [groups[i] for i in torch.randperm(full, generator=generator).tolist()] + groups[full:]
        parts.extend(shuffled)
    return torch.cat(parts) if parts else order


class ResumableSampler(Sampler[int]):
    """Per-sample sampler: the epoch order of ``range(num_samples)``, starting at ``position``.

    It holds a read position but never advances it itself (a prefetching loader draws indices
    ahead of what the model has consumed); whoever knows what was consumed calls
    :meth:`set_epoch`. For batches and data parallelism use :class:`ResumableBatchSampler`.
    """

    def __init__(self, num_samples: int, *, shuffle: bool = False, seed: int = 0) -> None:
        self.num_samples = _check_int("num_samples", num_samples, 1)
        self.shuffle = bool(shuffle)
        self.seed = _check_int("seed", seed, 0)
        self.epoch = 0
        self.position = 0

    def set_epoch(self, epoch: int, position: int = 0) -> None:
        """Make the next ``iter()`` start at sample ``position`` of epoch ``epoch``."""
        self.epoch = _check_int("epoch", epoch, 0)
        self.position = _check_int("position", position, 0)
        if position > self.num_samples:
            raise ValueError(f"position {position} is past the end of the epoch ({self.num_samples} samples)")

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        # Slice eagerly, so a later set_epoch cannot change an iterator already handed out.
        return iter(
            epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)[self.position :].tolist()
        )


class ResumableBatchSampler(Sampler[list[int]]):
    """Batches of indices for one rank, deterministic in (seed, epoch), startable at any batch.

    See the module docstring for the sharding rule. ``iter()`` yields this rank's batches of
    epoch ``self.epoch`` from global batch ``self.batch_index`` on; resuming is index arithmetic
    (slice the epoch order), so skipped batches are never loaded.

    Like :class:`ResumableSampler` it never advances its own position: the loader, which knows
    how many batches reached the user (not merely the prefetch queue), calls :meth:`set_epoch`.

    Args:
        num_samples: dataset length (>= 1).
        batch_size: samples per batch on each rank (>= 1).
        shuffle: shuffle each epoch (seeded by ``seed + epoch``), else sequential order.
        drop_last: drop the last incomplete global batch.
        seed: base seed (>= 0).
        num_replicas: data-parallel world size (>= 1).
        rank: this rank, in ``[0, num_replicas)``.
        lengths: per-sample lengths; when given, each global batch holds samples of similar
            length (``group_by_length``), so padding to the batch's longest wastes little.
        length_window: global batches per window that ``group_by_length`` sorts.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        shuffle: bool = False,
        drop_last: bool = False,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        lengths: Any = None,
        length_window: int = 50,
    ) -> None:
        self.num_samples = _check_int("num_samples", num_samples, 1)
        self.length_window = _check_int("length_window", length_window, 1)
        self.lengths = None
        if lengths is not None:
            self.lengths = torch.as_tensor(lengths, dtype=torch.int64)
            if self.lengths.shape != (num_samples,):
                raise ValueError(f"lengths must hold one int per sample ({num_samples}), got shape "
                                 f"{list(self.lengths.shape)}")
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.num_replicas = _check_int("num_replicas", num_replicas, 1)
        self.rank = _check_int("rank", rank, 0)
        if rank >= num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank}")
        self.seed = _check_int("seed", seed, 0)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        if self.drop_last and num_samples < self.global_batch_size:
            # Zero batches per epoch would make a training loop spin through empty epochs.
            raise ValueError(
                f"drop_last=True with {num_samples} samples < global batch {self.global_batch_size} "
                f"(batch_size={batch_size} x num_replicas={num_replicas}) gives no batches at all"
            )
        self.epoch = 0
        self.batch_index = 0

    @property
    def global_batch_size(self) -> int:
        """Samples per step over all ranks: ``batch_size * num_replicas``."""
        return self.batch_size * self.num_replicas

    def __len__(self) -> int:
        """Batches per epoch (the same on every rank)."""
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def set_epoch(self, epoch: int, batch_index: int = 0) -> None:
        """Make the next ``iter()`` start at global batch ``batch_index`` of epoch ``epoch``."""
        _check_int("epoch", epoch, 0)
        _check_int("batch_index", batch_index, 0)
        if batch_index > len(self):
            raise ValueError(f"batch_index {batch_index} is past the end of the epoch ({len(self)} batches)")
        self.epoch, self.batch_index = epoch, batch_index

    def global_batch(self, order: torch.Tensor, index: int) -> torch.Tensor:
        """Global batch ``index`` of an epoch ``order``, padded as the module docstring says."""
        g = self.global_batch_size
        batch = order[index * g : (index + 1) * g]
        short = len(batch) % self.num_replicas
        if short:
            pad = self.num_replicas - short
            # Cycle from the epoch's start; the modulo covers datasets smaller than the padding.
            batch = torch.cat([batch, order[torch.arange(pad) % self.num_samples]])
        return batch

    def local_batch(self, order: torch.Tensor, index: int) -> list[int]:
        """This rank's contiguous slice of global batch ``index``."""
        batch = self.global_batch(order, index)
        k = len(batch) // self.num_replicas
        return batch[self.rank * k : (self.rank + 1) * k].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        # Capture (epoch, start) now rather than inside a generator body, which would run only at
        # the first next(): the loader may reposition the sampler between creating iterators.
        order = epoch_order(self.num_samples, self.seed, self.epoch, self.shuffle)
        if self.lengths is not None:
            order = group_by_length(order, self.lengths, self.global_batch_size, self.length_window,
                                    self.seed, self.epoch)
        return (self.local_batch(order, b) for b in range(self.batch_index, len(self)))

"""A resumable DataLoader: torch's DataLoader (workers, prefetch queue) driven by a resumable sampler.

What sampan adds on top of ``torch.utils.data.DataLoader``, all for bit-exact resume:

* the batch order is a function of (seed, epoch) only (:class:`ResumableBatchSampler`);
* the loader keeps a position, (epoch, batches handed to the user), that ``state_dict`` saves
  and ``load_state_dict`` restores by index arithmetic, without loading skipped data;
* torch's DataLoader gets a private ``generator`` seeded from (seed, epoch): without one it draws
  each iterator's worker base seed from the *global* torch RNG, so merely starting an epoch would
  shift the model's dropout stream and a resumed run would diverge;
* each worker seeds Python's ``random``, numpy's global RNG and torch from (seed, epoch, worker_id).

Worker processes and prefetching are torch's own; nothing here reimplements them.
"""

from __future__ import annotations

import random
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.utils.data

from sampan.io._seeding import SALT_TORCH_LOADER, SALT_WORKER, derive_seed
from sampan.io.collate import default_collate
from sampan.io.sampler import ResumableBatchSampler

__all__ = ["DataLoader"]

_STATE_KEYS = ("epoch", "batch_index", "seed", "num_samples", "batch_size", "num_replicas")


class _WorkerSeeder:
    """``worker_init_fn`` that seeds a worker from (seed, epoch, worker_id), then runs the user's.

    A class rather than a closure so it pickles under the spawn / forkserver start methods.
    """

    def __init__(self, seed: int, user_fn: Callable[[int], None] | None) -> None:
        self.seed = seed
        self.epoch = 0  # set by the loader before each torch iterator starts its workers
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        s = derive_seed(self.seed, self.epoch, worker_id, SALT_WORKER)
        random.seed(s)
        np.random.seed(s & 0xFFFF_FFFF)  # numpy's legacy seed takes 32 bits
        torch.manual_seed(s)
        if self.user_fn is not None:
            self.user_fn(worker_id)


class DataLoader:
    """Resumable, shardable data loader over a map-style dataset.

    Iterating yields the batches of the current epoch from the current position; when the
    epoch is exhausted the loader moves to the next one (``epoch += 1``, position 0) and the
    iteration stops, so ``for batch in loader`` runs one epoch, and the next ``for`` the next.

    Position and ``iter()``: the loader is a cursor. ``iter(loader)`` starts a new iterator at
    the loader's current position, i.e. right after the last batch any earlier iterator handed
    out, and supersedes that earlier iterator: calling ``next`` on a superseded iterator raises
    ``RuntimeError`` (two live iterators advancing one position would silently skip batches).
    ``set_epoch`` and ``load_state_dict`` also supersede the live iterator.

    Args:
        dataset: a map-style dataset (``__len__`` and ``__getitem__``).
        batch_size: samples per batch on this rank.
        shuffle: shuffle each epoch with ``randperm`` seeded by ``seed + epoch``.
        drop_last: drop the last incomplete global batch.
        collate_fn: merges a list of samples into a batch (default: ``default_collate``).
        num_workers: worker processes (0 loads in the calling process).
        prefetch_factor: batches each worker loads ahead (ignored when ``num_workers == 0``).
        seed: base seed for the order and the workers' RNGs (>= 0).
        num_replicas: data-parallel world size; the global batch is ``batch_size * num_replicas``.
        rank: this rank in ``[0, num_replicas)``; see :mod:`sampan.io.sampler` for the rule.
        pin_memory: as in torch (copy batches to pinned memory for faster host-to-GPU copies).
        persistent_workers: keep workers alive across epochs. Their RNGs are seeded once, from
            the epoch in which they started, and then run on.
        worker_init_fn: called in each worker with its id, after sampan seeds the worker.
        lengths: per-sample lengths: batch samples of similar length together
            (:func:`sampan.io.sampler.group_by_length`), which cuts padding for variable-length text.

    Attributes:
        wait_seconds: cumulative seconds the consumer spent blocked getting batches (in
            ``__next__``, worker start-up included); compare it to step time to see whether
            training is input-bound.

    Bit-exact resume also needs a dataset whose item ``i`` does not depend on RNG state carried
    between items: after a resume, batches go to different workers than before, so a dataset
    that draws random numbers should derive them from the index (and epoch), not a running RNG.
    """

    def __init__(
        self,
        dataset: torch.utils.data.Dataset,
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        prefetch_factor: int = 2,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        worker_init_fn: Callable[[int], None] | None = None,
        lengths: Any = None,
    ) -> None:
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError(
                f"DataLoader needs a map-style dataset (__len__ and __getitem__), got {type(dataset).__name__}"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
        if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, int) or prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be an int >= 1, got {prefetch_factor!r}")
        num_samples = len(dataset)
        if num_samples == 0:
            raise ValueError("dataset is empty: there is nothing to load")
        self.dataset = dataset
        self.batch_sampler = ResumableBatchSampler(
            num_samples,
            batch_size,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
            num_replicas=num_replicas,
            rank=rank,
            lengths=lengths,
        )
        self.num_workers = num_workers
        self.wait_seconds = 0.0
        self._epoch = 0
        self._batch_index = 0
        # A weak reference: the iterator refers to the loader, and a strong reference back would
        # make a cycle, so an abandoned iterator (a `break` out of the loop) would wait for the
        # cyclic GC, which finalizes torch's worker iterator so late that its shutdown stalls
        # (measured: ~5 s per worker). With a weak one, dropping the iterator stops its workers.
        self._active: weakref.ref[_LoaderIterator] | None = None
        self._generator = torch.Generator()
        self._worker_seeder = _WorkerSeeder(seed, worker_init_fn) if num_workers > 0 else None
        self._torch_loader = torch.utils.data.DataLoader(
            dataset,
            batch_sampler=self.batch_sampler,
            collate_fn=collate_fn if collate_fn is not None else default_collate,
            num_workers=num_workers,
            # torch rejects a prefetch_factor without workers.
            prefetch_factor=prefetch_factor if num_workers > 0 else None,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers and num_workers > 0,
            worker_init_fn=self._worker_seeder,
            generator=self._generator,
        )

    # -- position -----------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from."""
        return self._epoch

    @property
    def batch_index(self) -> int:
        """Batches of the current epoch already handed to the user."""
        return self._batch_index

    @property
    def seed(self) -> int:
        """Base seed of the order and of the workers' RNGs."""
        return self.batch_sampler.seed

    @property
    def batch_size(self) -> int:
        """Samples per batch on this rank."""
        return self.batch_sampler.batch_size

    def __len__(self) -> int:
        """Batches per epoch (on this rank; the same on every rank)."""
        return len(self.batch_sampler)

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its first batch at the next ``iter()``."""
        self._set_position(epoch, 0)

    def _set_position(self, epoch: int, batch_index: int) -> None:
        self.batch_sampler.set_epoch(epoch, batch_index)  # validates both
        self._epoch, self._batch_index = epoch, batch_index
        self._supersede()

    def _supersede(self) -> None:
        active = self._active() if self._active is not None else None
        if active is not None:
            active._close()
        self._active = None

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self._supersede()
        iterator = _LoaderIterator(self)
        self._active = weakref.ref(iterator)
        return iterator

    # -- checkpointing ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The loader's position and the settings it is only valid for, as a JSON-safe dict.

        ``batch_index`` counts batches handed to the user, not ones merely prefetched by workers.
        """
        s = self.batch_sampler
        return {
            "epoch": self._epoch,
            "batch_index": self._batch_index,
            "seed": s.seed,
            "num_samples": s.num_samples,
            "batch_size": s.batch_size,
            "num_replicas": s.num_replicas,
            "shuffle": s.shuffle,
            "drop_last": s.drop_last,
            "group_by_length": s.lengths is not None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue, at the next ``iter()``, with exactly the batch after the saved position.

        The saved order must be reproducible here: dataset length, seed, shuffle and drop_last
        must match, and so must the global batch size. ``batch_size`` and ``num_replicas`` may
        differ when their product does not (e.g. 2 ranks x 8 saved, 4 ranks x 4 loaded): the
        global batches, and so the data each step sees, are then the same.

        Raises:
            ValueError: a key is missing or mistyped, or a setting differs (the message says which).
        """
        for key in _STATE_KEYS:
            if key not in state_dict:
                raise ValueError(f"loader state_dict lacks {key!r} (has {sorted(state_dict)})")
            value = state_dict[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"loader state_dict[{key!r}] must be an int, got {value!r}")
        s = self.batch_sampler
        if state_dict["num_samples"] != s.num_samples:
            raise ValueError(
                f"dataset length differs: the state was saved with {state_dict['num_samples']} samples, "
                f"this loader's dataset has {s.num_samples}"
            )
        if state_dict["seed"] != s.seed:
            raise ValueError(
                f"seed differs: the state was saved with seed={state_dict['seed']}, this loader has "
                f"seed={s.seed}; build the loader with seed={state_dict['seed']} to resume its order"
            )
        saved_global = state_dict["batch_size"] * state_dict["num_replicas"]
        if saved_global != s.global_batch_size:
            raise ValueError(
                "global batch size differs: the state was saved with batch_size="
                f"{state_dict['batch_size']} x num_replicas={state_dict['num_replicas']} = {saved_global}, "
                f"this loader has batch_size={s.batch_size} x num_replicas={s.num_replicas} = "
                f"{s.global_batch_size}"
            )
        mine = {"shuffle": s.shuffle, "drop_last": s.drop_last, "group_by_length": s.lengths is not None}
        for key in mine:  # optional: absent in hand-written states
            if key in state_dict and bool(state_dict[key]) != mine[key]:
                raise ValueError(
                    f"{key} differs: the state was saved with {key}={state_dict[key]}, "
                    f"this loader has {key}={mine[key]}"
                )
        self._set_position(state_dict["epoch"], state_dict["batch_index"])


class _LoaderIterator:
    """One pass over the rest of the loader's current epoch; advances the loader's position."""

    def __init__(self, loader: DataLoader) -> None:
        self._loader = loader
        start = time.perf_counter()
        epoch = loader._epoch
        loader.batch_sampler.set_epoch(epoch, loader._batch_index)
        # Reseed per iterator: torch draws the workers' base seed from this generator when the
        # iterator is created, so it is a function of (seed, epoch) and never of the global RNG.
        loader._generator.manual_seed(derive_seed(loader.seed, epoch, SALT_TORCH_LOADER))
        if loader._worker_seeder is not None:
            loader._worker_seeder.epoch = epoch
        self._superseded = False
        self._it: Iterator[Any] | None = iter(loader._torch_loader)
        # Starting workers blocks the consumer too, so it counts as waiting.
        loader.wait_seconds += time.perf_counter() - start

    def __iter__(self) -> _LoaderIterator:
        return self

    def __next__(self) -> Any:
        loader = self._loader
        if self._superseded:
            raise RuntimeError(
                "this DataLoader iterator was superseded by a newer iter(loader), set_epoch or "
                "load_state_dict; iterate the new one (it continues from the loader's position)"
            )
        if self._it is None:
            raise StopIteration
        start = time.perf_counter()
        try:
            batch = next(self._it)
        except StopIteration:
            # Epoch exhausted: move the loader to the start of the next epoch.
            self._it = None
            loader._active = None
            loader._set_position(loader._epoch + 1, 0)
            raise
        finally:
            loader.wait_seconds += time.perf_counter() - start
        loader._batch_index += 1
        return batch

    def _close(self) -> None:
        # Dropping torch's iterator shuts its workers down (unless they are persistent).
        self._it = None
        self._superseded = True

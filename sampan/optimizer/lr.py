"""Learning-rate schedules with Paddle's API (``paddle.optimizer.lr``).

A scheduler is stepped by the user (``scheduler.step()``), usually once per optimizer step; the
optimizer reads ``scheduler()`` (the current ``last_lr``) at every ``Optimizer.step()``. As in Paddle,
construction calls ``step()`` once, so a fresh scheduler has ``last_epoch == 0`` and ``last_lr`` is the
LR for step 0. Every schedule here is closed-form in ``last_epoch``, so ``step(epoch)`` may jump anywhere.

``state_dict()`` is a plain dict of ints and floats (nested dicts for a wrapped scheduler), so it can be
written as JSON and checkpoints never need pickle.
"""

from __future__ import annotations

import math
from typing import Any

from sampan.optimizer._checks import check_int, check_non_negative

__all__ = [
    "LRScheduler",
    "ConstantLR",
    "LinearWarmup",
    "LinearDecay",
    "CosineAnnealingDecay",
    "WarmupStableDecay",
]


class LRScheduler:
    """Base class: subclasses implement ``get_lr()`` for ``self.last_epoch``.

    Args:
        learning_rate: the base learning rate (``self.base_lr``).
        last_epoch: the step index before the first ``step()``; -1 starts from step 0.
        verbose: print the new LR on every ``step()``.
    """

    def __init__(self, learning_rate: float = 0.1, last_epoch: int = -1, verbose: bool = False) -> None:
        self.base_lr = check_non_negative("learning_rate", learning_rate)
        self.last_epoch = check_int("last_epoch", last_epoch, minimum=-1)
        self.last_lr = self.base_lr
        self.verbose = verbose
        self.step()

    def __call__(self) -> float:
        """The current learning rate (``last_lr``)."""
        return self.last_lr

    def step(self, epoch: int | None = None) -> None:
        """Advance to ``epoch`` (default: the next step) and recompute ``last_lr``."""
        if epoch is None:
            self.last_epoch += 1
        else:
            self.last_epoch = check_int("epoch", epoch)
        self.last_lr = float(self.get_lr())
        if self.verbose:
            print(f"Epoch {self.last_epoch}: {type(self).__name__} set learning rate to {self.last_lr}.")

    def get_lr(self) -> float:
        """The learning rate for step ``self.last_epoch``."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_lr()")

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of the scheduler's progress."""
        return {"last_epoch": self.last_epoch, "last_lr": self.last_lr}

    def set_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore progress saved by ``state_dict()``."""
        missing = {"last_epoch", "last_lr"} - state_dict.keys()
        if missing:
            raise KeyError(f"{type(self).__name__} state_dict is missing keys {sorted(missing)}")
        self.last_epoch = int(state_dict["last_epoch"])
        self.last_lr = float(state_dict["last_lr"])

    load_state_dict = set_state_dict


class ConstantLR(LRScheduler):
    """A constant learning rate (useful where a scheduler object is expected)."""

    def __init__(self, learning_rate: float, last_epoch: int = -1, verbose: bool = False) -> None:
        super().__init__(learning_rate, last_epoch, verbose)

    def get_lr(self) -> float:
        return self.base_lr


class LinearWarmup(LRScheduler):
    """Linear warmup from ``start_lr`` to ``end_lr`` over ``warmup_steps``, then ``learning_rate``.

    ``learning_rate`` may be a float or another ``LRScheduler``; the latter is driven in sync, seeing
    epoch ``last_epoch - warmup_steps`` after warmup.
    """

    def __init__(
        self,
        learning_rate: float | LRScheduler,
        warmup_steps: int,
        start_lr: float,
        end_lr: float,
        last_epoch: int = -1,
        verbose: bool = False,
    ) -> None:
        if not isinstance(learning_rate, LRScheduler):
            learning_rate = check_non_negative("learning_rate", learning_rate)
        self.learning_rate = learning_rate
        self.warmup_steps = check_int("warmup_steps", warmup_steps)
        self.start_lr = check_non_negative("start_lr", start_lr)
        self.end_lr = check_non_negative("end_lr", end_lr)
        super().__init__(start_lr, last_epoch, verbose)

    def get_lr(self) -> float:
        if self.last_epoch < self.warmup_steps:
            return self.start_lr + (self.end_lr - self.start_lr) * self.last_epoch / self.warmup_steps
        if isinstance(self.learning_rate, LRScheduler):
            self.learning_rate.step(self.last_epoch - self.warmup_steps)
            return self.learning_rate()
        return self.learning_rate

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if isinstance(self.learning_rate, LRScheduler):
            state["learning_rate"] = self.learning_rate.state_dict()
        return state

    def set_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().set_state_dict(state_dict)
        if isinstance(self.learning_rate, LRScheduler):
            if "learning_rate" not in state_dict:
                raise KeyError("LinearWarmup state_dict is missing the wrapped scheduler's 'learning_rate'")
            self.learning_rate.set_state_dict(state_dict["learning_rate"])

    load_state_dict = set_state_dict


class LinearDecay(LRScheduler):
    """Linear decay from ``learning_rate`` at step 0 to ``end_lr`` at ``total_steps``, then constant."""

    def __init__(
        self,
        learning_rate: float,
        total_steps: int,
        end_lr: float = 0.0,
        last_epoch: int = -1,
        verbose: bool = False,
    ) -> None:
        self.total_steps = check_int("total_steps", total_steps, minimum=1)
        self.end_lr = check_non_negative("end_lr", end_lr)
        super().__init__(learning_rate, last_epoch, verbose)

    def get_lr(self) -> float:
        progress = min(self.last_epoch, self.total_steps) / self.total_steps
        return self.base_lr + (self.end_lr - self.base_lr) * progress


class CosineAnnealingDecay(LRScheduler):
    """Cosine from ``learning_rate`` at step 0 to ``eta_min`` at ``T_max``, then ``eta_min``.

    Closed form ``eta_min + (lr - eta_min) * (1 + cos(pi * t / T_max)) / 2``, not Paddle's recursive
    update, so ``step(epoch)`` can jump and float error does not accumulate.
    """

    def __init__(
        self,
        learning_rate: float,
        T_max: int,
        eta_min: float = 0.0,
        last_epoch: int = -1,
        verbose: bool = False,
    ) -> None:
        self.T_max = check_int("T_max", T_max, minimum=1)
        self.eta_min = check_non_negative("eta_min", eta_min)
        super().__init__(learning_rate, last_epoch, verbose)

    def get_lr(self) -> float:
        if self.last_epoch >= self.T_max:
            return self.eta_min
        cosine = (1.0 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2.0
        return self.eta_min + (self.base_lr - self.eta_min) * cosine


_DECAY_TYPES = ("linear", "cosine", "sqrt")


class WarmupStableDecay(LRScheduler):
    """The warmup-stable-decay (WSD) schedule.

    Steps ``[0, warmup_steps)`` rise linearly from ``start_lr`` to ``learning_rate``; the next
    ``stable_steps`` hold ``learning_rate``; the next ``decay_steps`` fall to ``min_lr`` along
    ``decay_type`` ("linear", "cosine" or "sqrt": ``1 - sqrt(progress)``); after that ``min_lr``.
    """

    def __init__(
        self,
        learning_rate: float,
        warmup_steps: int,
        stable_steps: int,
        decay_steps: int,
        min_lr: float = 0.0,
        start_lr: float = 0.0,
        decay_type: str = "linear",
        last_epoch: int = -1,
        verbose: bool = False,
    ) -> None:
        self.warmup_steps = check_int("warmup_steps", warmup_steps)
        self.stable_steps = check_int("stable_steps", stable_steps)
        self.decay_steps = check_int("decay_steps", decay_steps)
        self.min_lr = check_non_negative("min_lr", min_lr)
        self.start_lr = check_non_negative("start_lr", start_lr)
        if decay_type not in _DECAY_TYPES:
            raise ValueError(f"decay_type must be one of {_DECAY_TYPES}, got {decay_type!r}")
        self.decay_type = decay_type
        super().__init__(learning_rate, last_epoch, verbose)

    def get_lr(self) -> float:
        t = self.last_epoch
        if t < self.warmup_steps:
            return self.start_lr + (self.base_lr - self.start_lr) * t / self.warmup_steps
        t -= self.warmup_steps
        if t < self.stable_steps:
            return self.base_lr
        t -= self.stable_steps
        if t >= self.decay_steps:
            return self.min_lr
        progress = t / self.decay_steps
        if self.decay_type == "linear":
            remaining = 1.0 - progress
        elif self.decay_type == "cosine":
            remaining = (1.0 + math.cos(math.pi * progress)) / 2.0
        else:
            remaining = 1.0 - math.sqrt(progress)
        return self.min_lr + (self.base_lr - self.min_lr) * remaining

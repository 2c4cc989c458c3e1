"""Gradient clipping with Paddle's class names, for an optimizer's ``grad_clip=``.

Each is a callable ``clip(parameters)`` that clips the ``.grad`` of the given tensors in place
(tensors without a gradient are skipped).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

__all__ = ["ClipGradByGlobalNorm", "ClipGradByNorm", "ClipGradByValue"]


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}")
    if not value > 0.0:
        raise ValueError(f"{name} must be in (0, inf), got {value}")
    return float(value)


def _with_grad(parameters: Iterable[Tensor]) -> list[Tensor]:
    return [p for p in parameters if p.grad is not None]


class ClipGradByGlobalNorm:
    """Scale all gradients together so that their global L2 norm is at most ``clip_norm``."""

    def __init__(self, clip_norm: float) -> None:
        self.clip_norm = _check_positive("clip_norm", clip_norm)

    def __call__(self, parameters: Iterable[Tensor]) -> Tensor:
        """Clip in place; return the global norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(_with_grad(parameters), self.clip_norm)

    def __repr__(self) -> str:
        return f"ClipGradByGlobalNorm(clip_norm={self.clip_norm})"


class ClipGradByNorm:
    """Scale each gradient separately so that its own L2 norm is at most ``clip_norm``."""

    def __init__(self, clip_norm: float) -> None:
        self.clip_norm = _check_positive("clip_norm", clip_norm)

    def __call__(self, parameters: Iterable[Tensor]) -> None:
        """Clip in place."""
        for param in _with_grad(parameters):
            torch.nn.utils.clip_grad_norm_([param], self.clip_norm)

    def __repr__(self) -> str:
        return f"ClipGradByNorm(clip_norm={self.clip_norm})"


class ClipGradByValue:
    """Clamp every gradient element into ``[min, max]``; ``min`` defaults to ``-max``."""

    def __init__(self, max: float, min: float | None = None) -> None:
        if min is None:
            self.max = _check_positive("max", max)
            self.min = -self.max
        else:
            self.max, self.min = float(max), float(min)
            if not self.min < self.max:
                raise ValueError(f"min must be < max, got min={min}, max={max}")

    def __call__(self, parameters: Iterable[Tensor]) -> None:
        """Clip in place."""
        # Not torch.nn.utils.clip_grad_value_: it only clips to a symmetric range.
        with torch.no_grad():
            for param in _with_grad(parameters):
                param.grad.clamp_(self.min, self.max)

    def __repr__(self) -> str:
        return f"ClipGradByValue(max={self.max}, min={self.min})"

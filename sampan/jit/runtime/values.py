"""What the converters ask of a value: is it a tensor, has it a value, and its tensor form."""

from __future__ import annotations

from typing import Any

import torch

from sampan.jit.errors import Dy2StaticError
from sampan.jit.runtime.undefined_vars import UndefinedVar

# Python numbers (and their symbolic forms while tracing): carried as 0-d tensors.
NUMBER = (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)


def is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def is_undefined(value: Any) -> bool:
    return value is None or isinstance(value, UndefinedVar)


def scalar_pred(pred: torch.Tensor, what: str, where: str) -> torch.Tensor:
    """A tensor condition as the 0-d bool tensor ``torch.cond`` / ``torch.while_loop`` take."""
    if pred.numel() != 1:
        raise Dy2StaticError(
            f"{where}: the condition of this '{what}' is a tensor of shape {list(pred.shape)}; a branch "
            "needs one value. Reduce it with .any() or .all().")
    pred = pred.reshape(()) if pred.dim() else pred
    return pred if pred.dtype == torch.bool else pred != 0


def as_tensor(value: Any, like: torch.Tensor | None = None) -> torch.Tensor:
    """``value`` as a tensor: a number becomes a 0-d tensor (of ``like``'s dtype, if given)."""
    if is_tensor(value):
        return value
    if like is not None:
        dtype = like.dtype
    elif isinstance(value, (bool, torch.SymBool)):
        dtype = torch.bool
    elif isinstance(value, (int, torch.SymInt)):
        dtype = torch.int64
    else:
        dtype = torch.get_default_dtype()
    # torch.full, not torch.tensor: a tensor constant inside a cond / while_loop body cannot be
    # serialised by torch.export ("getattr nodes containing tensors"); a factory op can.
    return torch.full((), value, dtype=dtype)

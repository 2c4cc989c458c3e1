"""``_jst.Item`` / ``Float`` / ``Int`` / ``Bool`` (``cast`` pass): ``.item()`` / ``float()`` /
``int()`` / ``bool()`` in a condition, kept a 0-d tensor for a tensor so the condition stays in
the graph (it then becomes a ``torch.cond`` / ``torch.while_loop``)."""

from __future__ import annotations

import builtins
from typing import Any

import torch

from sampan.jit.errors import Dy2StaticError
from sampan.jit.runtime.values import is_tensor


def _one(value: torch.Tensor, what: str, where: str) -> torch.Tensor:
    if value.numel() != 1:
        raise Dy2StaticError(f"{where}: {what} of a tensor with {value.numel()} elements; it needs exactly one. "
                             "Reduce it first (.sum(), .any(), .all()).")
    return value.reshape(())


def Item(value: Any, where: str) -> Any:
    """``value.item()`` in a condition: a 0-d tensor, so the comparison stays in the graph.
    Floating values widen to float64, the precision of the Python float they stand for."""
    if not is_tensor(value):
        return value.item()
    value = _one(value, ".item()", where)
    return value.to(torch.float64) if value.is_floating_point() else value


def Float(value: Any, where: str) -> Any:
    """``float(value)`` in a condition: a float64 0-d tensor for a tensor."""
    return _one(value, "float()", where).to(torch.float64) if is_tensor(value) else builtins.float(value)


def Int(value: Any, where: str) -> Any:
    """``int(value)`` in a condition: an int64 0-d tensor (truncated toward zero) for a tensor."""
    if not is_tensor(value):
        return builtins.int(value)
    value = _one(value, "int()", where)
    return value.trunc().to(torch.int64) if value.is_floating_point() else value.to(torch.int64)


def Bool(value: Any, where: str) -> Any:
    """``bool(value)`` in a condition: a bool 0-d tensor for a tensor."""
    return _one(value, "bool()", where) != 0 if is_tensor(value) else builtins.bool(value)

"""``_jst.And`` / ``Or`` / ``Not`` (``logical`` pass): short-circuit for Python values, a
``logical_*`` op for tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sampan.jit.runtime.values import as_tensor, is_tensor


def And(left: Any, right: Callable[[], Any]) -> Any:
    """``left and right()``: short-circuit for Python values, ``logical_and`` for tensors."""
    if not is_tensor(left):
        return left and right()
    return torch.logical_and(left, as_tensor(right()))


def Or(left: Any, right: Callable[[], Any]) -> Any:
    """``left or right()``: short-circuit for Python values, ``logical_or`` for tensors."""
    if not is_tensor(left):
        return left or right()
    return torch.logical_or(left, as_tensor(right()))


def Not(value: Any) -> Any:
    """``not value``, or ``logical_not`` for a tensor."""
    return torch.logical_not(value) if is_tensor(value) else not value

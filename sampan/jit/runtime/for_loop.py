"""``_jst.ForIter`` / ``_jst.Range`` (``for_loop`` pass): what a ``for`` turned ``while``
iterates, by Python index over a Python sequence, by tensor index over a tensor, a tensor
``range`` or a tensor array (the ``while`` then becomes a ``torch.while_loop``)."""

from __future__ import annotations

import builtins
from typing import Any

import torch

from sampan.jit.errors import Dy2StaticError
from sampan.jit.runtime.values import is_tensor
from sampan.jit.tensor_array import TensorArray


class TensorRange:
    """``range(start, stop, step)`` where ``start`` or ``stop`` is a tensor (``step`` a Python int)."""

    def __init__(self, start: Any, stop: Any, step: int, where: str):
        if is_tensor(step) or not isinstance(step, int) or step == 0:
            raise Dy2StaticError(f"{where}: range() over tensors needs a non-zero Python int step, got {step!r}")
        self.start, self.stop, self.step = start, stop, step


def Range(*args: Any, where: str = "range") -> Any:
    """``range`` that accepts tensor bounds (then iterated by a ``torch.while_loop``)."""
    if not any(is_tensor(a) for a in args):
        return builtins.range(*args)
    if len(args) == 1:
        return TensorRange(0, args[0], 1, where)
    return TensorRange(args[0], args[1], args[2] if len(args) > 2 else 1, where)


class ForIter:
    """What a converted ``for`` iterates: a Python sequence by Python index, a tensor (its first
    dimension), a tensor ``range`` or a tensor array by tensor index."""

    def __init__(self, iterable: Any, where: str):
        self.where = where
        self.range = iterable if isinstance(iterable, TensorRange) else None
        # A copy: the iterable is often a view (`for v in x[i]`), and a loop body that reads both
        # it and its base makes torch.while_loop refuse two aliasing inputs.
        self.tensor = iterable.clone() if is_tensor(iterable) else None
        self.array = iterable if isinstance(iterable, TensorArray) else None
        if self.range is None and self.tensor is None and self.array is None:
            seq = (list, tuple, builtins.range)
            self.items = iterable if isinstance(iterable, seq) else list(iterable)
        if self.tensor is not None and self.tensor.dim() == 0:
            raise Dy2StaticError(f"{where}: cannot iterate over a 0-d tensor")

    def _python(self) -> bool:
        return self.range is None and self.tensor is None and (
            self.array is None or not is_tensor(self.array.count))

    def start(self) -> Any:
        return 0 if self._python() else torch.zeros((), dtype=torch.int64)

    def bound(self) -> Any:
        """The most iterations this loop can run (None when only the run decides: a tensor range)."""
        if self.range is not None:
            return None
        if self.tensor is not None:
            return self.tensor.shape[0]
        if self.array is not None:
            return self.array.capacity
        return len(self.items)

    def has_next(self, idx: Any) -> Any:
        if self.range is not None:
            r = self.range
            pos = r.start + idx * r.step
            return pos < r.stop if r.step > 0 else pos > r.stop
        if self.tensor is not None:
            return idx < self.tensor.shape[0]
        if self.array is not None:
            return idx < self.array.count
        if is_tensor(idx):
            raise Dy2StaticError(f"{self.where}: a loop over a Python sequence cannot be driven by a tensor")
        return idx < len(self.items)

    def get(self, idx: Any) -> Any:
        if self.range is not None:
            return self.range.start + idx * self.range.step
        if self.tensor is not None:
            # index_select, not tensor[idx]: indexing by a 0-d tensor asks for its integer value,
            # which a graph loop does not have.
            return self.tensor.index_select(0, idx.reshape(1)).squeeze(0)
        if self.array is not None:
            return self.array.get(idx)
        return self.items[idx]

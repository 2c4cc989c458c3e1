"""``TensorArray``: a list appended under tensor control flow, held as a buffer plus a count.

A graph cannot grow a Python list inside a ``torch.cond`` branch or a ``torch.while_loop``
iteration, so a list appended there becomes a preallocated buffer ``[capacity, *element_shape]``
and a count (Paddle turns such lists into a ``LoDTensorArray`` for the same reason). Every path
must append tensors of one shape. ``limit`` is a static upper bound on the count: appends past
the capacity grow the buffer where that is allowed (outside a graph loop body, whose carried
shapes are fixed), and a loop reserves room for all its iterations before it starts.

``torch.stack(lst)`` / ``torch.cat(lst)`` / ``len(lst)`` / ``lst[i]`` / ``for v in lst`` work on
it (the ``list_append`` pass routes them here); the stacked result has ``count`` rows, a size the
graph learns at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from sampan.jit.errors import Dy2StaticError
from sampan.jit.indexing import wrap_index


class Element(NamedTuple):
    """Shape, dtype and device of a tensor array's elements (metadata only: a probe's tensors
    must not be computed with outside the probe)."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> Element:
        return cls(tuple(t.shape), t.dtype, t.device)


def _index(count: Any) -> torch.Tensor:
    if isinstance(count, torch.Tensor):
        return count.reshape(1).to(torch.int64)
    return torch.full((1,), count, dtype=torch.int64)


class TensorArray:
    """A list of same-shaped tensors: ``buffer[:count]`` are the elements.

    Attributes:
        buffer: ``[capacity, *element_shape]``; rows at and past ``count`` are unused.
        count: the number of elements, a Python int while it is known, else a 0-d int64 tensor.
        limit: a static upper bound on ``count`` (at most the capacity).
    """

    def __init__(self, buffer: torch.Tensor, count: Any, limit: Any):
        self.buffer, self.count, self.limit = buffer, count, limit

    @property
    def capacity(self) -> Any:
        return self.buffer.shape[0]

    @property
    def element(self) -> Element:
        return Element(tuple(self.buffer.shape[1:]), self.buffer.dtype, self.buffer.device)

    @classmethod
    def from_list(cls, items: Sequence[Any], capacity: Any, like: Element, where: str) -> TensorArray:
        """A TensorArray holding ``items`` with room for ``capacity`` elements like ``like``."""
        for item in items:
            _check_element(item, like, where)
        rows = [torch.as_tensor(item, dtype=like.dtype).reshape(like.shape) for item in items]
        pad = torch.zeros((capacity - len(rows), *like.shape), dtype=like.dtype, device=like.device)
        buffer = torch.cat([torch.stack(rows), pad]) if rows else pad
        return cls(buffer, len(rows), len(rows))

    def reserve(self, extra: Any) -> TensorArray:
        """This array with room for ``extra`` more elements (a bigger buffer if needed)."""
        need = self.limit + extra
        if need <= self.capacity:
            return self
        pad = self.buffer.new_zeros((need - self.capacity, *self.buffer.shape[1:]))
        return TensorArray(torch.cat([self.buffer, pad]), self.count, self.limit)

    def append(self, value: Any, where: str) -> TensorArray:
        """A new TensorArray with ``value`` appended (functional: graphs cannot mutate in place)."""
        _check_element(value, self.element, where)
        grown = self.reserve(1)
        row = torch.as_tensor(value, dtype=grown.buffer.dtype).unsqueeze(0)
        buffer = grown.buffer.index_copy(0, _index(grown.count), row)
        return TensorArray(buffer, grown.count + 1, grown.limit + 1)

    def length(self) -> Any:
        return self.count

    def stack(self, dim: int = 0) -> torch.Tensor:
        """``torch.stack`` of the elements: the first ``count`` rows of the buffer."""
        count = self.count
        if isinstance(count, torch.Tensor):
            # The number of rows is known only at run time: an unbacked size for the graph,
            # bounded by the capacity so later ops can reason about it.
            count = count.item()
            torch._check(count >= 0)
            torch._check(count <= self.capacity)
        rows = self.buffer.narrow(0, 0, count)
        return rows if dim == 0 else rows.movedim(0, dim if dim >= 0 else dim + rows.dim())

    def cat(self, dim: int = 0) -> torch.Tensor:
        """``torch.cat`` of the elements along ``dim``."""
        element_dims = self.buffer.dim() - 1
        if element_dims == 0:
            raise Dy2StaticError("torch.cat of a tensor array needs elements with at least one dimension")
        dim = dim if dim >= 0 else dim + element_dims
        return self.stack(dim).flatten(dim, dim + 1)

    def get(self, index: Any) -> torch.Tensor:
        """Element ``index`` (negative counts from ``count``, as for a list)."""
        if not isinstance(index, torch.Tensor):
            if not isinstance(self.count, torch.Tensor) and index >= 0:
                return self.buffer[index]
            index = torch.full((), index, dtype=torch.int64)
        return self.buffer.index_select(0, wrap_index(index, self.count).reshape(1)).squeeze(0)

    def __repr__(self) -> str:
        return f"TensorArray(count={self.count}, capacity={self.capacity}, element={list(self.buffer.shape[1:])})"


def _check_element(value: Any, like: Element, where: str) -> None:
    shape = tuple(value.shape) if isinstance(value, torch.Tensor) else ()
    if not isinstance(value, (torch.Tensor, bool, int, float)) or shape != tuple(like.shape):
        got = f"shape {list(shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise Dy2StaticError(
            f"{where}: this list is appended under tensor control flow, so it is held as a tensor array, "
            f"whose elements must all have one shape, but it has elements of shape {list(like.shape)} and "
            f"{got}. Append tensors of one shape (pad them), or build the list outside the tensor condition.")

"""Indexing by a tensor: ``x[i]`` / ``x[i] = v`` where ``i`` is a 0-d integer tensor.

Python indexing asks the index for its integer value, which a graph loop does not have (torch
raises "Could not extract specialized integer from data-dependent expression u0" deep inside
export). Here an integer-tensor index becomes ``index_select`` along its dimension (a read) or an
out-of-place ``index_put`` (a write), whose shapes never depend on the index's value; negative
indices count from the end, as in Python. Slices, ``None`` and ``...`` apply as usual first.
"""

from __future__ import annotations

from typing import Any

import torch

from sampan.jit.errors import Dy2StaticError


def is_tensor_int(item: Any) -> bool:
    """A 0-d integer tensor: what Python would turn into an int index."""
    return (isinstance(item, torch.Tensor) and item.dim() == 0 and not item.is_floating_point()
            and not item.is_complex() and item.dtype != torch.bool)


def _tensor_bound(item: Any) -> bool:
    return isinstance(item, slice) and any(isinstance(b, torch.Tensor) for b in (item.start, item.stop, item.step))


def needs_conversion(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(is_tensor_int(i) or _tensor_bound(i) for i in items)


def _int_bounds(items: tuple) -> tuple:
    """Slices with tensor bounds get Python-int bounds (``.item()``): under torch.compile and
    torch.export an unbacked size, so ``x[i:j]`` has a length known only at run time, which a
    graph can hold at its top level (not as a value a tensor loop carries from one iteration to
    the next, whose shape must stay fixed)."""
    def bound(b: Any) -> Any:
        return b.item() if isinstance(b, torch.Tensor) else b

    return tuple(slice(bound(i.start), bound(i.stop), bound(i.step)) if _tensor_bound(i) else i for i in items)


def wrap_index(t: torch.Tensor, size: Any) -> torch.Tensor:
    """A 0-d integer tensor index as int64, a negative one counted from ``size`` (as Python does)."""
    t = t.reshape(()).to(torch.int64)
    return torch.where(t < 0, t + size, t)


def _split(ndim: int, items: tuple) -> tuple[list, list]:
    """(basic index with each tensor int replaced by a full slice, [(dim in its result, tensor)])."""
    consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
    basic, picks, out_dim = [], [], 0
    for item in items:
        if item is None:
            basic.append(None)
            out_dim += 1
        elif item is Ellipsis:
            basic.append(Ellipsis)
            out_dim += ndim - consumed
        elif is_tensor_int(item):
            basic.append(slice(None))
            picks.append((out_dim, item))
            out_dim += 1
        elif isinstance(item, slice):
            basic.append(item)
            out_dim += 1
        else:  # a Python int (consumes its dimension) or another tensor index
            basic.append(item)
            if isinstance(item, torch.Tensor):
                out_dim += 1 if item.dtype != torch.bool else 0
    return basic, picks


def get_item(value: Any, index: Any, where: str) -> Any:
    """``value[index]`` with integer-tensor indices as ``index_select``."""
    items = _int_bounds(index if isinstance(index, tuple) else (index,))
    index = items if isinstance(index, tuple) else items[0]
    if isinstance(value, (list, tuple)) and len(items) == 1 and is_tensor_int(items[0]):
        if not value or not all(isinstance(v, torch.Tensor) and v.shape == value[0].shape for v in value):
            raise Dy2StaticError(
                f"{where}: a list indexed by a tensor must hold tensors of one shape (they are stacked and "
                "the row picked by index_select). Index it with a Python int, or keep a tensor instead.")
        value = torch.stack(list(value))
    if not isinstance(value, torch.Tensor) or any(isinstance(i, torch.Tensor) and not is_tensor_int(i) for i in items):
        return value[index]  # mixed with advanced (tensor) indexing: torch decides
    basic, picks = _split(value.dim(), items)
    out = value[tuple(basic)]
    for dim, t in reversed(picks):  # from the last, so earlier dims keep their positions
        out = out.index_select(dim, wrap_index(t, out.shape[dim]).reshape(1)).squeeze(dim)
    return out


def set_item(value: Any, index: Any, new: Any, where: str) -> Any:
    """``value[index] = new`` with integer-tensor indices, out of place (``index_put``)."""
    items = _int_bounds(index if isinstance(index, tuple) else (index,))
    if not isinstance(value, torch.Tensor):
        raise Dy2StaticError(f"{where}: only a tensor can be assigned at a tensor index, not a "
                             f"{type(value).__name__}. Use a tensor, or a Python int index.")
    if any(i is None or (isinstance(i, slice) and i != slice(None)) or
           (isinstance(i, torch.Tensor) and not is_tensor_int(i)) for i in items):
        raise Dy2StaticError(
            f"{where}: x[...] = v at a tensor index converts when the other indices are ints, ':' or '...'; "
            "this one has a partial slice, None or a tensor of indices. Write it as "
            "x = torch.where(mask, v, x) with a mask built from torch.arange.")
    consumed = sum(1 for i in items if i is not Ellipsis)
    indices: list = []
    for item in items:
        if item is Ellipsis:
            indices.extend([None] * (value.dim() - consumed))
        elif isinstance(item, slice):
            indices.append(None)
        else:
            size = value.shape[len(indices)]
            t = item if isinstance(item, torch.Tensor) else torch.full((), item, dtype=torch.int64)
            indices.append(wrap_index(t, size))
    new = torch.as_tensor(new, dtype=value.dtype, device=value.device)
    return torch.index_put(value, indices, new)

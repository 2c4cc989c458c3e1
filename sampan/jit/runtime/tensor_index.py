"""``_jst.GetItem`` / ``_jst.SetItem`` (``tensor_index`` pass): ``x[i]`` and ``x[i] = v`` that
also take an integer-tensor index (``sampan.jit.indexing``) and index a tensor array."""

from __future__ import annotations

from typing import Any

from sampan.jit import indexing
from sampan.jit.tensor_array import TensorArray


def GetItem(value: Any, index: Any, where: str) -> Any:
    """``value[index]``; an integer-tensor index reads with ``index_select`` (see ``indexing``)."""
    if isinstance(value, TensorArray):
        return value.get(index)
    if not indexing.needs_conversion(index):
        return value[index]
    return indexing.get_item(value, index, where)


def SetItem(value: Any, index: Any, new: Any, where: str) -> Any:
    """``value[index] = new``, returning the updated value: in place for Python indices (as in
    Python), out of place (``index_put``) for an integer-tensor index."""
    if not indexing.needs_conversion(index):
        value[index] = new
        return value
    return indexing.set_item(value, index, new, where)

"""``_jst.Append`` / ``Stack`` / ``Cat`` / ``Len`` / ``ListValue`` (``list_append`` pass): list
operations that also take a :class:`~sampan.jit.tensor_array.TensorArray`, which a list appended
under tensor control flow becomes (``ifelse`` / ``while_loop`` make it)."""

from __future__ import annotations

import builtins
from typing import Any

import torch

from sampan.jit.errors import Dy2StaticError
from sampan.jit.tensor_array import TensorArray


def Append(target: Any, value: Any, where: str) -> Any:
    """``target.append(value)``, returning the list: in place for a Python list (as in Python);
    a new :class:`TensorArray` for a tensor array (graphs cannot mutate in place)."""
    if isinstance(target, TensorArray):
        return target.append(value, where)
    target.append(value)
    return target


def Stack(tensors: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.stack`` that also takes a :class:`TensorArray`."""
    if isinstance(tensors, TensorArray):
        return tensors.stack(*args, **kwargs)
    return torch.stack(tensors, *args, **kwargs)


def Cat(tensors: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.cat`` that also takes a :class:`TensorArray`."""
    if isinstance(tensors, TensorArray):
        return tensors.cat(*args, **kwargs)
    return torch.cat(tensors, *args, **kwargs)


def Len(value: Any) -> Any:
    """``len``; for a :class:`TensorArray` its count (a tensor once control flow decided it)."""
    return value.length() if isinstance(value, TensorArray) else builtins.len(value)


def ListValue(value: Any, where: str) -> Any:
    """A list leaving the function: a tensor array cannot be returned as a Python list."""
    if isinstance(value, TensorArray):
        raise Dy2StaticError(
            f"{where}: this list was appended under tensor control flow, so it is a tensor array whose length "
            "is known only when the graph runs; a graph cannot return it as a Python list. Return "
            "torch.stack(...) of it instead.")
    return value

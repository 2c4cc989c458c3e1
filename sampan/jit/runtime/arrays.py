"""Lists appended under tensor control flow: how much they grew, and the tensor array that
holds them (a buffer sized for the most elements any path can append)."""

from __future__ import annotations

from typing import Any

import torch

from sampan.jit.runtime.values import is_tensor
from sampan.jit.tensor_array import Element, TensorArray


def count(value: list | TensorArray) -> Any:
    """The elements a list holds, or the most a tensor array may hold."""
    return len(value) if isinstance(value, list) else value.limit


def growth(before: Any, after: Any) -> int:
    """How many elements were appended to a list or tensor array (0 for anything else)."""
    if isinstance(before, (list, TensorArray)) and isinstance(after, (list, TensorArray)):
        return int(count(after) - count(before))
    return 0


def array_bound(base: list | TensorArray, grow: Any, times: Any = 1) -> Any:
    """The most elements ``base`` can hold after ``times`` rounds of appends adding ``grow`` each
    (the branches of an ``if``: one round; a loop: one per iteration): the size of a tensor
    array's buffer, and its ``limit``."""
    return count(base) + times * grow


def element_like(base: list | TensorArray, *outs: Any) -> Element:
    """Shape, dtype and device of what was appended to ``base`` (from a probe's results)."""
    if isinstance(base, TensorArray):
        return base.element
    for out in outs:
        if isinstance(out, TensorArray):
            return out.element
        if isinstance(out, list) and len(out) > len(base):
            item = out[len(base)]
            return Element.of(item) if is_tensor(item) else Element((), torch.get_default_dtype(), None)
    raise AssertionError("no appended element")


def with_room(base: list | TensorArray, extra: Any, outs: tuple, where: str) -> TensorArray:
    """``base`` as a tensor array with room for ``extra`` more elements like those appended in
    ``outs`` (a probe's results); its ``limit`` stays ``base``'s count, as nothing is appended yet."""
    if isinstance(base, TensorArray):
        return base.reserve(extra)
    return TensorArray.from_list(base, array_bound(base, extra), element_like(base, *outs), where)

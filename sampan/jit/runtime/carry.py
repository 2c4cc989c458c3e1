"""Values a ``torch.cond`` / ``torch.while_loop`` carries: tensors, numbers, tuples of them and
tensor arrays, and the checks on what a branch or loop body may change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from sampan.jit.errors import Dy2StaticError
from sampan.jit.runtime.values import NUMBER, as_tensor, is_tensor
from sampan.jit.tensor_array import TensorArray


def carriable(value: Any) -> bool:
    """Whether graph control flow can carry ``value`` (so a branch or loop body may change it)."""
    if is_tensor(value) or isinstance(value, (*NUMBER, TensorArray)):
        return True
    return isinstance(value, tuple) and bool(value) and all(carriable(v) for v in value)


def to_carry(value: Any, like: Any = None) -> Any:
    """``value`` as a pytree of tensors (numbers become 0-d tensors shaped like ``like``'s leaf)."""
    if isinstance(value, TensorArray):
        return (value.buffer, as_tensor(value.count))
    if isinstance(value, tuple):
        likes = like if isinstance(like, tuple) and len(like) == len(value) else (None,) * len(value)
        return tuple(to_carry(v, lk) for v, lk in zip(value, likes, strict=True))
    return as_tensor(value, like if is_tensor(like) else None)


def from_carry(carry: Any, template: Any, limit: Any = None) -> Any:
    """Rebuild a carried value shaped like ``template`` (a TensorArray gets ``limit``)."""
    if isinstance(template, TensorArray):
        return TensorArray(carry[0], carry[1], template.limit if limit is None else limit)
    if isinstance(template, tuple):
        return tuple(from_carry(c, t) for c, t in zip(carry, template, strict=True))
    return carry


def zeros_like(value: Any) -> Any:
    """A value with ``value``'s structure, shapes and dtypes, all zero (a loop's start value)."""
    if is_tensor(value):
        return torch.zeros(value.shape, dtype=value.dtype, device=value.device)
    if isinstance(value, tuple):
        return tuple(zeros_like(v) for v in value)
    return type(value)(0) if isinstance(value, (bool, int, float)) else value


def copy_lists(values: Sequence[Any]) -> list:
    """``values`` with each list copied, so that a probe's appends do not reach the real list."""
    return [list(v) if isinstance(v, list) else v for v in values]


def clone_tree(tree: Any) -> Any:
    # torch.cond / while_loop refuse a branch output that is one of its inputs (aliasing), and an
    # outer tensor returned by a branch cannot be told apart from a fresh one while tracing: copy
    # (inductor fuses the copy into the op that produced the value).
    return pytree.tree_map(lambda t: t.clone() if is_tensor(t) else t, tree)


def check_unchanged(outs: Sequence[Any], args: Sequence[Any], idx: Sequence[int], names: Sequence[str],
                    what: str, where: str) -> None:
    """Refuse a branch or body that rebinds one of ``args[idx]`` (values no graph can carry)."""
    for i in idx:
        if outs[i] is not args[i]:
            kind = "list" if isinstance(args[i], list) else type(args[i]).__name__
            fix = ("Change lists only with .append (which converts), or build the list outside the condition."
                   if isinstance(args[i], list) else
                   "Make it a tensor, or compute it outside the condition.")
            raise Dy2StaticError(
                f"{where}: '{names[i]}' holds a {kind} and is reassigned inside this tensor '{what}'; only "
                f"tensors, numbers, tuples of them and appended lists can change under a tensor condition. {fix}")


def no_new_element(names: Sequence[str], i: int, what: str, where: str) -> Dy2StaticError:
    """The error for an output that some path leaves without a carriable value."""
    return Dy2StaticError(
        f"{where}: under this tensor '{what}', '{names[i]}' must be a tensor, a number or a tuple of them "
        "on every path, but one path leaves it without such a value. Give it one on every path (assign it "
        "before the condition, or in both branches).")

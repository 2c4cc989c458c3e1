"""``print`` inside converted code: printed where and when it runs, also under a tensor condition.

Plain Python (no graph) prints as usual. While ``torch.compile`` traces, a ``print`` becomes the
custom op ``sampan_jit::print_values``, whose kernel prints: inside a ``torch.cond`` branch or a
``torch.while_loop`` body it prints only when, and as often as, the branch or iteration runs.
The op is registered as having a side effect (no dead-code pass removes it) and returns a 0-d
token that converted code carries on (``_jst_printed``), so that a branch whose only statement is
a ``print`` still has an output. (torch 2.13's own ``print`` higher-order op does not print under
``aot_eager`` and breaks the ``cond`` backward; dynamo's reorderable logging drops a print inside
a ``cond`` branch.) The ``file`` goes to the op as a key: a graph holds constants, not files.

An exported program (``jit.save``) does not print: ``.pt2`` and ONNX files have no print op.
"""

from __future__ import annotations

import builtins
import sys
import weakref
from typing import Any

import torch

# Files that converted prints write to, by key: a compiled graph refers to the key.
_FILES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_STDOUT = 0


@torch._dynamo.assume_constant_result
def file_key(file: Any) -> int:
    """A key for ``file`` (``0``: standard output) that a graph can carry as a constant (dynamo
    runs this while tracing and keeps the result, so registering the file is no side effect)."""
    if file is None:
        return _STDOUT
    key = id(file)
    try:
        _FILES[key] = file
    except TypeError:  # an object without weak references: keep it for the process
        _KEEP[key] = file
    return key


_KEEP: dict[int, Any] = {}


def _file(key: int) -> Any:
    if key == _STDOUT:
        return sys.stdout
    return _FILES.get(key) or _KEEP.get(key) or sys.stdout


_SLOT = "\x00"  # a tensor's place among the printed constants
_SPLIT = "\x1e"  # between the printed items (a custom op takes one str, not a list)


@torch.library.custom_op("sampan_jit::print_values", mutates_args=())
def print_values(values: list[torch.Tensor], parts: str, sep: str, end: str, key: int) -> torch.Tensor:
    """Print the items of ``parts`` with each ``_SLOT`` replaced by the next of ``values``;
    returns a 0-d int64 token."""
    tensors = iter(values)
    items = [next(tensors) if p == _SLOT else p for p in parts.split(_SPLIT)] if parts else []
    builtins.print(*items, sep=sep, end=end, file=_file(key), flush=True)
    return torch.zeros((), dtype=torch.int64)


@print_values.register_fake
def _print_values_fake(values: list[torch.Tensor], parts: str, sep: str, end: str, key: int) -> torch.Tensor:
    return torch.empty((), dtype=torch.int64)


def _no_gradient(ctx: Any, grad: torch.Tensor) -> tuple:
    return None, None, None, None, None  # the token carries no gradient to what was printed


print_values.register_autograd(_no_gradient)
torch.fx.node.has_side_effect(torch.ops.sampan_jit.print_values.default)


def print_in_graph(args: tuple, sep: str, end: str, key: int) -> torch.Tensor:
    """Print from inside a ``cond`` branch / ``while_loop`` body; returns the op's token."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    parts = _SPLIT.join(_SLOT if isinstance(a, torch.Tensor) else str(a) for a in args)
    return print_values(tensors, parts, sep, end, key)

"""Probe runs: learn what a branch or a loop body produces (shapes, dtypes, list appends) before
building the ``torch.cond`` / ``torch.while_loop`` that needs to know it.

A graph loop needs an initial value for everything it carries, and a ``return`` inside a loop
leaves a value that has none before the loop; a list appended under a tensor condition needs its
element shape before a buffer can hold it. A probe runs the branch or body once as straight-line
code: the converters see :func:`probing` and take *every* path of a tensor ``if`` (merging what
the paths assign), run one iteration of a tensor ``while``, skip ``assert`` / ``print``, and
never build a ``cond`` / ``while_loop``. Only the metadata of the results is used:

- eagerly, the probe runs under a ``FakeTensorMode``, so no arithmetic happens;
- while ``torch.export`` traces (on fake tensors), recording is switched off for the probe;
- while ``torch.compile`` traces, its ops are recorded but their results are unused;
  :func:`remove_probe_nodes` deletes them from the graph (the function's name below is what
  marks them in each node's stack trace).

The probe depth is a class attribute: ``torch.compile`` accepts its balanced update inside a
``cond`` / ``while_loop`` body, where a module-level global would be refused as a side effect.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

_MARK = "_sampan_probe_run"


class _State:
    depth = 0


def probing() -> bool:
    """Whether converted code is running as a probe (so converters take the straight-line path)."""
    return _State.depth > 0


def _has_fake(args: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(leaf, FakeTensor) for leaf in pytree.tree_leaves(args))


def _sampan_probe_run(fn: Callable, args: tuple) -> Any:
    if torch.compiler.is_dynamo_compiling():
        return fn(*args)  # recorded, then removed by remove_probe_nodes
    if torch.compiler.is_exporting() or _has_fake(args):
        # torch.export (non-strict) runs Python on fake tensors and records their ops: run the
        # probe with recording off (its ops still compute shapes, on the fake tensors). A size the
        # probe reads from a tensor (.item() of a tensor array's count) is a new unbacked symbol
        # that nothing returns: the shape environment must not wait for it.
        from torch._guards import detect_fake_mode
        from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

        mode = detect_fake_mode(args)
        ignore = (mode.shape_env.ignore_fresh_unbacked_symbols() if mode is not None and mode.shape_env is not None
                  else contextlib.nullcontext())
        with disable_proxy_modes_tracing(), ignore:
            return fn(*args)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # Static shapes for the real inputs; the shape environment gives a value read from a tensor
    # (.item()) a symbol instead of failing.
    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(), static_shapes=True):
        return fn(*args)


def probe(fn: Callable, *args: Any) -> Any:
    """``fn(*args)`` run as a probe; use only the metadata (shape, dtype, structure) of the result."""
    _State.depth += 1
    try:
        return _sampan_probe_run(fn, args)
    finally:
        _State.depth -= 1


def _pure(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return not node.target.endswith("_")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "") or str(node.target)
        return not name.removesuffix(".default").endswith("_") and not node.is_impure()
    return False


def remove_probe_nodes(module: torch.nn.Module) -> int:
    """Delete the unused nodes a probe recorded, in ``module``'s graph and its subgraphs (a
    ``cond`` branch, a ``while_loop`` body). Returns how many were removed."""
    removed = 0
    for gm in module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        changed = False
        for node in reversed(list(gm.graph.nodes)):
            if not node.users and _pure(node) and _MARK in (node.meta.get("stack_trace") or ""):
                gm.graph.erase_node(node)
                changed = True
                removed += 1
        if changed:
            gm.recompile()
    return removed

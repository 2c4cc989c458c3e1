"""``_jst.While`` (``while_loop`` pass; a ``for`` becomes one too): a loop that runs as Python
while its condition is a Python value and as one ``torch.while_loop`` once it is a tensor.

A name with no value before a tensor loop is local to one iteration; the return value of a
``return`` inside the loop is the exception: a probe of the body gives its shape, and the loop
carries it from a zero value. A list appended in the loop becomes a tensor array with room for
every iteration's appends (the loop's ``bound``). Through the loop each carried value keeps its
shape and dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from sampan.jit.errors import Dy2StaticError
from sampan.jit.passes.loop_return import RETURN_PREFIX
from sampan.jit.probe import probe, probing
from sampan.jit.runtime.arrays import array_bound, growth, with_room
from sampan.jit.runtime.carry import (
    carriable,
    check_unchanged,
    clone_tree,
    copy_lists,
    from_carry,
    no_new_element,
    to_carry,
    zeros_like,
)
from sampan.jit.runtime.hop import call_hop
from sampan.jit.runtime.undefined_vars import UndefinedVar
from sampan.jit.runtime.values import NUMBER, as_tensor, is_tensor, is_undefined, scalar_pred
from sampan.jit.tensor_array import TensorArray


def While(cond_fn: Callable, body_fn: Callable, args: tuple, names: tuple[str, ...], where: str,
          bound: Any = None) -> tuple:
    """Loop ``args = body_fn(*args)`` while ``cond_fn(*args)``; as ``torch.while_loop`` once the
    condition is a tensor (a loop may start in Python and switch when a tensor enters its state).

    ``bound`` (from a ``for`` loop: the length of what it iterates, when known) caps the number
    of iterations, so a list appended in the loop can be given a buffer big enough.
    """
    values = tuple(args)
    while True:
        pred = cond_fn(*values)
        if is_tensor(pred):
            if probing():
                return _probe_iteration(body_fn, values, names, where, bound)
            return _tensor_while(cond_fn, body_fn, values, names, where, bound)
        if not pred:
            return values
        values = tuple(body_fn(*values))


def _loop_array(before: list | TensorArray, after: Any, bound: Any, name: str, where: str) -> TensorArray:
    """The tensor array a list appended in a tensor loop becomes: room for ``bound`` iterations of
    the appends one iteration made (``after``)."""
    grow = growth(before, after)
    if bound is None:
        raise Dy2StaticError(
            f"{where}: the list '{name}' is appended inside this tensor loop, whose number of iterations is "
            "not known before it runs, so no buffer can be sized for it. Loop with 'for' over a tensor (or "
            "a Python range), or write into a preallocated tensor.")
    return with_room(before, bound * grow, (after,), where)


def _loop_local_reason(where: str) -> str:
    """Why a name first assigned inside a tensor loop has no value after it."""
    return f"it is assigned inside the tensor 'while' at {where} but has no value before the loop; initialise it before the loop"


def _probe_iteration(body_fn: Callable, values: tuple, names: tuple[str, ...], where: str, bound: Any) -> tuple:
    """A probe of a tensor loop, as the real ``while_loop`` would leave it: one iteration's values;
    a name with no value before the loop stays without one (a return value excepted, as the
    runtime fills it in); a list appended in the loop becomes a tensor array with room for
    ``bound`` iterations (a Python int here: the probe also runs when shapes are symbolic only
    inside the real loop); a number becomes a 0-d tensor."""
    outs = body_fn(*copy_lists(values))
    merged = []
    for before, after, name in zip(values, outs, names, strict=True):
        if is_undefined(before) and not name.startswith(RETURN_PREFIX):
            after = UndefinedVar(name, _loop_local_reason(where))
        elif growth(before, after) > 0:
            array = _loop_array(before, after, bound, name, where)
            after = TensorArray(array.buffer, array.count, array_bound(before, growth(before, after), bound))
        merged.append(as_tensor(after) if isinstance(after, NUMBER) else after)
    return tuple(merged)


def _differentiating() -> bool:
    """Whether autograd records this call (an export traces inference: no workaround there)."""
    return torch.is_grad_enabled() and not torch.compiler.is_exporting()


def _tensor_while(cond_fn: Callable, body_fn: Callable, args: tuple, names: tuple[str, ...],
                  where: str, bound: Any) -> tuple:
    values = list(args)
    per_iteration: dict[int, tuple] = {}
    returns = [i for i, v in enumerate(values) if is_undefined(v) and names[i].startswith(RETURN_PREFIX)]
    appended = [i for i, v in enumerate(values) if isinstance(v, (list, TensorArray))]
    if returns or appended:
        outs = probe(body_fn, *copy_lists(values))
        for i in returns:
            if carriable(outs[i]):
                values[i] = zeros_like(outs[i])
        for i in appended:
            grow = growth(values[i], outs[i])
            if grow > 0:
                # Most elements at the start of any iteration, and after the loop.
                per_iteration[i] = (array_bound(values[i], grow, bound - 1) if bound is not None else None,
                                    array_bound(values[i], grow, bound) if bound is not None else None)
                values[i] = _loop_array(values[i], outs[i], bound, names[i], where)
    carried, locals_, fixed = [], [], []
    for i, value in enumerate(values):
        if carriable(value):
            carried.append(i)
        elif is_undefined(value):
            locals_.append(i)
        else:
            fixed.append(i)
    init = tuple(to_carry(values[i]) for i in carried)
    # Tensor arrays' limits inside an iteration. Computed here: an outer tensor read inside the
    # body (even for its shape) becomes an extra input of the loop, aliasing a carry.
    limits = {i: during for i, (during, _) in per_iteration.items()}

    def fill(ops: Sequence[Any]) -> list:
        by_slot = dict(zip(carried, ops, strict=False))
        return [from_carry(by_slot[i], a, limits.get(i)) if i in by_slot else a for i, a in enumerate(values)]

    def cond(*ops: Any) -> torch.Tensor:
        pred = cond_fn(*fill(ops))
        return scalar_pred(pred, "while", where) if is_tensor(pred) else as_tensor(bool(pred))

    def body(*ops: Any) -> tuple:
        outs = body_fn(*fill(ops))
        check_unchanged(outs, values, fixed, names, "while", where)
        inputs = pytree.tree_leaves(ops)
        result = []
        for i, op in zip(carried, ops, strict=False):
            if not carriable(outs[i]):
                raise no_new_element(names, i, "while", where)
            body_out = to_carry(outs[i], op)
            leaves_out, spec_out = pytree.tree_flatten(body_out)
            leaves_in, spec_in = pytree.tree_flatten(op)
            if spec_out != spec_in or any(a.dtype != b.dtype or a.shape != b.shape
                                          for a, b in zip(leaves_out, leaves_in, strict=True)):
                got = [f"{a.dtype} {list(a.shape)}" for a in leaves_out]
                want = [f"{b.dtype} {list(b.shape)}" for b in leaves_in]
                raise Dy2StaticError(
                    f"{where}: '{names[i]}' enters this tensor 'while' as {', '.join(want)} and leaves an "
                    f"iteration as {', '.join(got)}; a graph loop keeps each variable's shape and dtype. "
                    "Preallocate it at full size (and cast) before the loop.")
            # torch.while_loop refuses a body output that is one of its inputs (aliasing).
            result.append(pytree.tree_map(lambda t: t.clone() if any(t is x for x in inputs) else t, body_out))
        return tuple(result)

    outs = call_hop(torch.while_loop, "while", where, cond, body, init)
    if _differentiating() and any(t.requires_grad for t in pytree.tree_leaves(outs)):
        # torch 2.13: when the loop runs zero times, while_loop's backward still applies one
        # iteration's backward to the initial values (x * 2 in the body: dx = 2, not 1). The
        # outputs then equal the initial values; selecting those when the condition fails at
        # the start routes the gradient around the loop.
        ran = cond(*init)
        outs = pytree.tree_map(lambda out, start: torch.where(ran, out, start) if out.is_floating_point() else out,
                               tuple(outs), init)
    # torch 2.13: a while_loop output that depends on module parameters carries unbacked stride
    # symbols, and a later torch.cond that reads it fails to lift them ("Source of '8*u0 - 8' is
    # None"). A copy has plain metadata; it costs one copy per loop, not per iteration.
    outs = clone_tree(tuple(outs))
    for i, loop_out in zip(carried, outs, strict=True):
        values[i] = from_carry(loop_out, values[i], per_iteration[i][1] if i in per_iteration else None)
    for i in locals_:
        values[i] = UndefinedVar(names[i], _loop_local_reason(where))
    return tuple(values)

"""``_jst.IfElse`` / ``_jst.IfExp`` (``ifelse`` pass): an ``if`` or ``a if c else b`` that runs
as Python for a Python predicate and as one ``torch.cond`` for a tensor one.

A name with no value before a tensor ``if`` is an output when *both* branches assign it;
assigned in one branch only, it is local to that branch and undefined after the ``if``. A list
appended in the branches is carried as a tensor array, or, when both branches append the same
number of same-shaped tensors, its new elements are outputs of the ``cond``.
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


def _probe_merge(first: Sequence[Any], second: Sequence[Any], before: Sequence[Any], names: Sequence[str],
                 where: str) -> tuple:
    """What a probe of both branches assigns, as the real ``cond`` would: per name the first
    branch's value. A name only one branch gives a value (it had none before) stays without one,
    as it is local to that branch; a return value takes the defined side, as the runtime fills it
    in. Lists appended in the branches become what the runtime makes of them (``_list_plan``).
    A number becomes a 0-d tensor, as a cond output does, so that a later Python ``if`` on it (a
    break flag set in one branch) is probed both ways too."""
    merged = []
    for a, b, base, name in zip(first, second, before, names, strict=True):
        if is_undefined(a) or is_undefined(b):
            value = b if is_undefined(a) else a
            if not name.startswith(RETURN_PREFIX):
                value = UndefinedVar(name, "it has a value on only some paths of a tensor condition")
        elif isinstance(base, (list, TensorArray)):
            plan = _list_plan(base, a, b, name, where)
            value = a if not isinstance(plan, TensorArray) else TensorArray(
                plan.buffer, plan.count, array_bound(base, _branch_growth(base, a, b)))
        else:
            value = a
        merged.append(as_tensor(value) if isinstance(value, NUMBER) else value)
    return tuple(merged)


def _list_plan(base: list | TensorArray, if_true: Any, if_false: Any, name: str, where: str) -> Any:
    """How a list appended under a tensor ``if`` is carried: an int (both branches append that many
    tensors of matching shapes to a Python list: the new elements are ``cond`` outputs), a
    :class:`TensorArray` with room for the longer branch, or None (no branch appends)."""
    def replaced(out: Any) -> bool:  # not the list it was, with elements appended
        return not isinstance(out, (list, TensorArray)) or (isinstance(base, list) and isinstance(out, list) and (
            len(out) < len(base) or any(a is not b for a, b in zip(base, out, strict=False))))

    if replaced(if_true) or replaced(if_false):
        raise Dy2StaticError(f"{where}: '{name}' is a list that a branch of this tensor 'if' replaces; only "
                             ".append can change a list under a tensor condition. Append to it instead.")
    grow_true, grow_false = growth(base, if_true), growth(base, if_false)
    if grow_true == grow_false == 0:
        return None
    if all(isinstance(v, list) for v in (base, if_true, if_false)) and grow_true == grow_false and all(
            is_tensor(a) and is_tensor(b) and a.shape == b.shape and a.dtype == b.dtype
            for a, b in zip(if_true[len(base):], if_false[len(base):], strict=True)):
        return grow_true
    return with_room(base, max(grow_true, grow_false), (if_true, if_false), where)


def _branch_growth(base: list | TensorArray, if_true: Any, if_false: Any) -> int:
    """The most elements either branch appends to ``base``."""
    return max(growth(base, if_true), growth(base, if_false))


def IfElse(pred: Any, true_fn: Callable, false_fn: Callable, args: tuple, names: tuple[str, ...],
           both: tuple[str, ...], where: str, select: bool = False, maybe: tuple[str, ...] = ()) -> tuple:
    """Run ``true_fn(*args)`` or ``false_fn(*args)``; with a tensor ``pred``, as one ``torch.cond``.

    ``select`` (set by the ``ifelse`` pass for an ``if`` inside a loop whose branches only
    compute): while exporting, run both branches and pick each output with ``torch.where``
    instead, which keeps the exported loop body free of nested control flow. The values are the
    same; both branches' work is done. Outputs whose shapes or dtypes differ between the
    branches keep the ``torch.cond``.

    ``maybe`` names those of ``both`` that some path of a branch may leave unassigned (one set
    inside a loop, say): with no value before the ``if``, a probe of both branches decides whether
    each is an output (both give it a value) or local to the branches.
    """
    if not is_tensor(pred):
        return true_fn(*args) if pred else false_fn(*args)
    pred = scalar_pred(pred, "if", where)
    if probing():
        return _probe_merge(true_fn(*copy_lists(args)), false_fn(*copy_lists(args)), args, names, where)
    values = list(args)
    limits: dict[int, Any] = {}
    extend: dict[int, int] = {}
    returns = [i for i, v in enumerate(values) if is_undefined(v) and names[i].startswith(RETURN_PREFIX)
               and names[i] not in both]
    appended = [i for i, v in enumerate(values) if isinstance(v, (list, TensorArray))]
    unsure = [i for i, v in enumerate(values) if is_undefined(v) and names[i] in maybe]
    if returns or appended or unsure:
        # A probe traces a branch (abstractly): the false branch only when the true one does not
        # tell all that is needed.
        outs_true = probe(true_fn, *copy_lists(values))
        outs_false = outs_true
        if appended or unsure or not all(carriable(outs_true[i]) for i in returns):
            outs_false = probe(false_fn, *copy_lists(values))
        both = tuple(n for i, n in enumerate(names) if n in both and (
            i not in unsure or (carriable(outs_true[i]) and carriable(outs_false[i]))))
        for i in returns:
            got = outs_true[i] if carriable(outs_true[i]) else outs_false[i]
            if carriable(got):
                values[i] = zeros_like(got)
        for i in appended:
            base = values[i]
            plan = _list_plan(base, outs_true[i], outs_false[i], names[i], where)
            if isinstance(plan, TensorArray):
                values[i] = plan
                limits[i] = array_bound(base, _branch_growth(base, outs_true[i], outs_false[i]))
            elif plan:
                extend[i] = plan
    inputs, outputs, locals_, fixed = [], [], [], []
    for i, (name, value) in enumerate(zip(names, values, strict=False)):
        if carriable(value):
            inputs.append(i)
            outputs.append(i)
        elif i in extend:
            outputs.append(i)
        elif is_undefined(value):
            (outputs if name in both else locals_).append(i)
        else:
            fixed.append(i)
    if not outputs and locals_:
        raise Dy2StaticError(
            f"{where}: {', '.join(repr(names[i]) for i in locals_)} is assigned in only one branch of this "
            "tensor 'if' and has no value before it, so it has no value after it either. Assign it before "
            "the 'if' or in both branches.")
    if not outputs and fixed:
        check_unchanged([object()] * len(values), values, fixed[:1], names, "if", where)  # names the first one
    if not outputs:
        raise Dy2StaticError(
            f"{where}: this 'if' has a tensor condition but assigns no variable, so a graph cannot express "
            "it: an in-place update (x.add_(1), x[i] = v on a tensor from outside) or a raise cannot be "
            "conditional on a tensor. Assign the new value instead (x = x + 1), or use 'assert' for checks.")
    operands = tuple(to_carry(values[i]) for i in inputs)

    def branch(fn: Callable) -> Callable:
        def run(*ops: Any) -> tuple:
            # Outer tensors must not be touched inside the branch (dynamo would lift them as
            # extra inputs), so the operand slots are filled without reading ``values`` there.
            by_slot = dict(zip(inputs, ops, strict=False))
            current = [from_carry(by_slot[i], v) if i in by_slot else (list(v) if i in extend else v)
                       for i, v in enumerate(values)]
            outs = fn(*current)
            check_unchanged(outs, values, fixed, names, "if", where)
            result = []
            for i in outputs:
                branch_out = outs[i]
                if i in extend:
                    new = branch_out[len(values[i]):] if isinstance(branch_out, list) else None
                    if new is None or len(new) != extend[i] or not all(is_tensor(t) for t in new):
                        raise no_new_element(names, i, "if", where)
                    result.append(tuple(t.clone() for t in new))
                    continue
                if not carriable(branch_out):
                    raise no_new_element(names, i, "if", where)
                # (A tensor array has room reserved for either branch's appends: its buffer keeps
                # its shape, as a cond output must.)
                result.append(clone_tree(to_carry(branch_out, by_slot.get(i))))
            return tuple(result)

        return run

    outs = None
    if select and torch.compiler.is_exporting():
        outs = _select(pred, branch(true_fn)(*operands), branch(false_fn)(*operands))
    if outs is None:
        outs = call_hop(torch.cond, "if", where, pred, branch(true_fn), branch(false_fn), operands)
    # (Names here and below are distinct from the branches' and body's: dynamo names the inputs it
    # lifts into a nested cond / while_loop after the variables that held them, and two inputs of
    # one name make it fail "duplicate argument 'out' in function definition".)
    for i, cond_out in zip(outputs, outs, strict=False):
        if i in extend:
            values[i].extend(cond_out)  # in place, as list.append is
        else:
            values[i] = from_carry(cond_out, values[i], limits.get(i))
    for i in locals_:
        values[i] = UndefinedVar(names[i], f"it is assigned in only one branch of the tensor 'if' at {where} "
                                           "and has no value before it; assign it before the 'if' or in "
                                           "both branches")
    return tuple(values)


def _select(pred: torch.Tensor, if_true: tuple, if_false: tuple) -> tuple | None:
    """``torch.where(pred, t, f)`` per output leaf, or None if a leaf's shape or dtype differs."""
    leaves_true, spec = pytree.tree_flatten(if_true)
    leaves_false, spec_false = pytree.tree_flatten(if_false)
    if spec != spec_false or any(t.shape != f.shape or t.dtype != f.dtype
                                 for t, f in zip(leaves_true, leaves_false, strict=True)):
        return None
    # onnxruntime has no Where kernel for bool tensors (a break flag): select those with logic.
    picked = [torch.logical_or(torch.logical_and(pred, t), torch.logical_and(torch.logical_not(pred), f))
              if t.dtype == torch.bool else torch.where(pred, t, f)
              for t, f in zip(leaves_true, leaves_false, strict=True)]
    return tuple(pytree.tree_unflatten(picked, spec))


def IfExp(pred: Any, true_fn: Callable, false_fn: Callable, where: str, select: bool = False) -> Any:
    """``a if pred else b``; with a tensor ``pred``, a ``torch.cond`` of the two values."""
    if not is_tensor(pred):
        return true_fn() if pred else false_fn()
    (value,) = IfElse(pred, lambda _: (true_fn(),), lambda _: (false_fn(),), (None,), ("<expr>",), ("<expr>",),
                      where, select)
    return value

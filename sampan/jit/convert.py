"""Runtime converters: what the AST passes' generated calls do when the code runs.

Each converter decides per call, from the values it sees: a Python predicate runs as plain
Python (inside ``torch.compile`` the graph specialises on it or unrolls the loop), a tensor
predicate becomes ``torch.cond`` / ``torch.while_loop``. Converted code refers to this module as
``_jst`` (Paddle's name for the same role).

Rules for variables under tensor control flow (they follow from what one graph can express):

- A tensor, a Python number (which becomes a 0-d tensor) or a tuple of those is carried through
  the ``cond`` / ``while_loop``; through a loop it must keep its shape and dtype.
- A name with no value before a tensor ``if`` is an output when *both* branches assign it;
  assigned in one branch only, it is local to that branch and undefined after the ``if``.
- A name with no value before a tensor ``while`` is local to one iteration. The return value of
  a ``return`` inside the loop is the exception: a probe of the body (``sampan.jit.probe``)
  gives its shape, and the loop carries it from a zero value.
- A list appended under a tensor condition is carried as a :class:`TensorArray` (or, when both
  branches of an ``if`` append the same number of same-shaped tensors, the new elements are
  outputs of the ``cond``). Other Python objects (layers, ``None``, strings) are read-only.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from sampan.jit import (
    indexing,
    printing,
    torch_fixes,  # noqa: F401 - applies the cond / while_loop backward fixes
)
from sampan.jit.diagnose import own_error, to_dy2static
from sampan.jit.errors import Dy2StaticError
from sampan.jit.passes.loop_return import RETURN_PREFIX
from sampan.jit.probe import probe, probing
from sampan.jit.tensor_array import Element, TensorArray

_NUMBER = (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)


class UndefinedVar:
    """The value of a name that has none yet (where Python would raise ``UnboundLocalError``)."""

    def __init__(self, name: str, reason: str | None = None):
        self.name = name
        self.reason = reason

    def _fail(self, *args: Any, **kwargs: Any):
        why = self.reason or "it is used before it is assigned"
        raise Dy2StaticError(f"'{self.name}' has no value here: {why}")

    __call__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _fail
    __matmul__ = __getitem__ = __neg__ = __lt__ = __gt__ = __le__ = __ge__ = __bool__ = _fail
    __len__ = __iter__ = __index__ = __float__ = __int__ = _fail

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()

    def __repr__(self) -> str:
        return f"UndefinedVar({self.name!r})"


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _is_undefined(value: Any) -> bool:
    return value is None or isinstance(value, UndefinedVar)


def _scalar_pred(pred: torch.Tensor, what: str, where: str) -> torch.Tensor:
    if pred.numel() != 1:
        raise Dy2StaticError(
            f"{where}: the condition of this '{what}' is a tensor of shape {list(pred.shape)}; a branch "
            "needs one value. Reduce it with .any() or .all().")
    pred = pred.reshape(()) if pred.dim() else pred
    return pred if pred.dtype == torch.bool else pred != 0


def _as_tensor(value: Any, like: torch.Tensor | None = None) -> torch.Tensor:
    if _is_tensor(value):
        return value
    if like is not None:
        dtype = like.dtype
    elif isinstance(value, (bool, torch.SymBool)):
        dtype = torch.bool
    elif isinstance(value, (int, torch.SymInt)):
        dtype = torch.int64
    else:
        dtype = torch.get_default_dtype()
    # torch.full, not torch.tensor: a tensor constant inside a cond / while_loop body cannot be
    # serialised by torch.export ("getattr nodes containing tensors"); a factory op can.
    return torch.full((), value, dtype=dtype)


def _call_hop(op: Callable, what: str, where: str, *args: Any) -> Any:
    """Run ``torch.cond`` / ``torch.while_loop``. Outside dynamo's tracing (eager runs, export),
    a :class:`Dy2StaticError` raised in a branch or body surfaces as itself (torch wraps it in a
    tracing error), and any other failure becomes one naming this construct."""
    if torch.compiler.is_dynamo_compiling():
        return op(*args)
    try:
        return op(*args)
    except Dy2StaticError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised as a Dy2StaticError with e chained
        own = own_error(e)
        if own is not None:
            raise own from None
        raise to_dy2static(e, f"this tensor '{what}' could not be converted", where) from e


# --- carried values: tensors, numbers, tuples of them, tensor arrays -----------------------------
def _carriable(value: Any) -> bool:
    if _is_tensor(value) or isinstance(value, (*_NUMBER, TensorArray)):
        return True
    return isinstance(value, tuple) and bool(value) and all(_carriable(v) for v in value)


def _to_carry(value: Any, like: Any = None) -> Any:
    """``value`` as a pytree of tensors (numbers become 0-d tensors shaped like ``like``'s leaf)."""
    if isinstance(value, TensorArray):
        return (value.buffer, _as_tensor(value.count))
    if isinstance(value, tuple):
        likes = like if isinstance(like, tuple) and len(like) == len(value) else (None,) * len(value)
        return tuple(_to_carry(v, lk) for v, lk in zip(value, likes, strict=True))
    return _as_tensor(value, like if _is_tensor(like) else None)


def _from_carry(carry: Any, template: Any, limit: Any = None) -> Any:
    """Rebuild a carried value shaped like ``template`` (a TensorArray gets ``limit``)."""
    if isinstance(template, TensorArray):
        return TensorArray(carry[0], carry[1], template.limit if limit is None else limit)
    if isinstance(template, tuple):
        return tuple(_from_carry(c, t) for c, t in zip(carry, template, strict=True))
    return carry


def _zeros_like(value: Any) -> Any:
    """A value with ``value``'s structure, shapes and dtypes, all zero (a loop's start value)."""
    if _is_tensor(value):
        return torch.zeros(value.shape, dtype=value.dtype, device=value.device)
    if isinstance(value, tuple):
        return tuple(_zeros_like(v) for v in value)
    return type(value)(0) if isinstance(value, (bool, int, float)) else value


def _copy_lists(values: Sequence[Any]) -> list:
    """``values`` with each list copied, so that a probe's appends do not reach the real list."""
    return [list(v) if isinstance(v, list) else v for v in values]


def _growth(before: Any, after: Any) -> int:
    """How many elements were appended to a list or tensor array (0 for anything else)."""
    if isinstance(before, (list, TensorArray)) and isinstance(after, (list, TensorArray)):
        return int(_count(after) - _count(before))
    return 0


def _count(value: list | TensorArray) -> Any:
    """The elements a list holds, or the most a tensor array may hold."""
    return len(value) if isinstance(value, list) else value.limit


def _unchanged(outs: Sequence[Any], args: Sequence[Any], idx: Sequence[int], names: Sequence[str],
               what: str, where: str) -> None:
    for i in idx:
        if outs[i] is not args[i]:
            kind = "list" if isinstance(args[i], list) else type(args[i]).__name__
            fix = ("Change lists only with .append (which converts), or build the list outside the condition."
                   if isinstance(args[i], list) else
                   "Make it a tensor, or compute it outside the condition.")
            raise Dy2StaticError(
                f"{where}: '{names[i]}' holds a {kind} and is reassigned inside this tensor '{what}'; only "
                f"tensors, numbers, tuples of them and appended lists can change under a tensor condition. {fix}")


def _clone_tree(tree: Any) -> Any:
    # torch.cond / while_loop refuse a branch output that is one of its inputs (aliasing), and an
    # outer tensor returned by a branch cannot be told apart from a fresh one while tracing: copy
    # (inductor fuses the copy into the op that produced the value).
    return pytree.tree_map(lambda t: t.clone() if _is_tensor(t) else t, tree)


def _no_new_element(names: Sequence[str], i: int, what: str, where: str) -> Dy2StaticError:
    return Dy2StaticError(
        f"{where}: under this tensor '{what}', '{names[i]}' must be a tensor, a number or a tuple of them "
        "on every path, but one path leaves it without such a value. Give it one on every path (assign it "
        "before the condition, or in both branches).")


# --- if / else ---------------------------------------------------------------------------------
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
        if _is_undefined(a) or _is_undefined(b):
            value = b if _is_undefined(a) else a
            if not name.startswith(RETURN_PREFIX):
                value = UndefinedVar(name, "it has a value on only some paths of a tensor condition")
        elif isinstance(base, (list, TensorArray)):
            plan = _list_plan(base, a, b, name, where)
            value = a if not isinstance(plan, TensorArray) else TensorArray(
                plan.buffer, plan.count, _count(base) + max(_growth(base, a), _growth(base, b)))
        else:
            value = a
        merged.append(_as_tensor(value) if isinstance(value, _NUMBER) else value)
    return tuple(merged)


def _element_like(base: list | TensorArray, *outs: Any) -> Element:
    """Shape, dtype and device of what was appended to ``base`` (from a probe's results)."""
    if isinstance(base, TensorArray):
        return base.element
    for out in outs:
        if isinstance(out, TensorArray):
            return out.element
        if isinstance(out, list) and len(out) > len(base):
            item = out[len(base)]
            return Element.of(item) if _is_tensor(item) else Element((), torch.get_default_dtype(), None)
    raise AssertionError("no appended element")


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
    grow_true, grow_false = _growth(base, if_true), _growth(base, if_false)
    if grow_true == grow_false == 0:
        return None
    if all(isinstance(v, list) for v in (base, if_true, if_false)) and grow_true == grow_false and all(
            _is_tensor(a) and _is_tensor(b) and a.shape == b.shape and a.dtype == b.dtype
            for a, b in zip(if_true[len(base):], if_false[len(base):], strict=True)):
        return grow_true
    grow = max(grow_true, grow_false)
    if isinstance(base, TensorArray):
        return base.reserve(grow)
    return TensorArray.from_list(base, len(base) + grow, _element_like(base, if_true, if_false), where)


def _loop_array(before: list | TensorArray, after: Any, bound: Any, name: str, where: str) -> TensorArray:
    """The tensor array a list appended in a tensor loop becomes: room for ``bound`` iterations of
    the appends one iteration made (``after``)."""
    grow = _growth(before, after)
    if bound is None:
        raise Dy2StaticError(
            f"{where}: the list '{name}' is appended inside this tensor loop, whose number of iterations is "
            "not known before it runs, so no buffer can be sized for it. Loop with 'for' over a tensor (or "
            "a Python range), or write into a preallocated tensor.")
    if isinstance(before, TensorArray):
        return before.reserve(bound * grow)
    return TensorArray.from_list(before, len(before) + bound * grow, _element_like(before, after), where)


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
    if not _is_tensor(pred):
        return true_fn(*args) if pred else false_fn(*args)
    pred = _scalar_pred(pred, "if", where)
    if probing():
        return _probe_merge(true_fn(*_copy_lists(args)), false_fn(*_copy_lists(args)), args, names, where)
    values = list(args)
    limits: dict[int, Any] = {}
    extend: dict[int, int] = {}
    returns = [i for i, v in enumerate(values) if _is_undefined(v) and names[i].startswith(RETURN_PREFIX)
               and names[i] not in both]
    appended = [i for i, v in enumerate(values) if isinstance(v, (list, TensorArray))]
    unsure = [i for i, v in enumerate(values) if _is_undefined(v) and names[i] in maybe]
    if returns or appended or unsure:
        # A probe traces a branch (abstractly): the false branch only when the true one does not
        # tell all that is needed.
        outs_true = probe(true_fn, *_copy_lists(values))
        outs_false = outs_true
        if appended or unsure or not all(_carriable(outs_true[i]) for i in returns):
            outs_false = probe(false_fn, *_copy_lists(values))
        both = tuple(n for i, n in enumerate(names) if n in both and (
            i not in unsure or (_carriable(outs_true[i]) and _carriable(outs_false[i]))))
        for i in returns:
            got = outs_true[i] if _carriable(outs_true[i]) else outs_false[i]
            if _carriable(got):
                values[i] = _zeros_like(got)
        for i in appended:
            base = values[i]
            plan = _list_plan(base, outs_true[i], outs_false[i], names[i], where)
            if isinstance(plan, TensorArray):
                values[i] = plan
                limits[i] = _count(base) + max(_growth(base, outs_true[i]), _growth(base, outs_false[i]))
            elif plan:
                extend[i] = plan
    inputs, outputs, locals_, fixed = [], [], [], []
    for i, (name, value) in enumerate(zip(names, values, strict=False)):
        if _carriable(value):
            inputs.append(i)
            outputs.append(i)
        elif i in extend:
            outputs.append(i)
        elif _is_undefined(value):
            (outputs if name in both else locals_).append(i)
        else:
            fixed.append(i)
    if not outputs and locals_:
        raise Dy2StaticError(
            f"{where}: {', '.join(repr(names[i]) for i in locals_)} is assigned in only one branch of this "
            "tensor 'if' and has no value before it, so it has no value after it either. Assign it before "
            "the 'if' or in both branches.")
    if not outputs and fixed:
        _unchanged([object()] * len(values), values, fixed[:1], names, "if", where)  # names the first one
    if not outputs:
        raise Dy2StaticError(
            f"{where}: this 'if' has a tensor condition but assigns no variable, so a graph cannot express "
            "it: an in-place update (x.add_(1), x[i] = v on a tensor from outside) or a raise cannot be "
            "conditional on a tensor. Assign the new value instead (x = x + 1), or use 'assert' for checks.")
    operands = tuple(_to_carry(values[i]) for i in inputs)

    def branch(fn: Callable) -> Callable:
        def run(*ops: Any) -> tuple:
            # Outer tensors must not be touched inside the branch (dynamo would lift them as
            # extra inputs), so the operand slots are filled without reading ``values`` there.
            by_slot = dict(zip(inputs, ops, strict=False))
            current = [_from_carry(by_slot[i], v) if i in by_slot else (list(v) if i in extend else v)
                       for i, v in enumerate(values)]
            outs = fn(*current)
            _unchanged(outs, values, fixed, names, "if", where)
            result = []
            for i in outputs:
                branch_out = outs[i]
                if i in extend:
                    new = branch_out[len(values[i]):] if isinstance(branch_out, list) else None
                    if new is None or len(new) != extend[i] or not all(_is_tensor(t) for t in new):
                        raise _no_new_element(names, i, "if", where)
                    result.append(tuple(t.clone() for t in new))
                    continue
                if not _carriable(branch_out):
                    raise _no_new_element(names, i, "if", where)
                # (A tensor array has room reserved for either branch's appends: its buffer keeps
                # its shape, as a cond output must.)
                result.append(_clone_tree(_to_carry(branch_out, by_slot.get(i))))
            return tuple(result)

        return run

    outs = None
    if select and torch.compiler.is_exporting():
        outs = _select(pred, branch(true_fn)(*operands), branch(false_fn)(*operands))
    if outs is None:
        outs = _call_hop(torch.cond, "if", where, pred, branch(true_fn), branch(false_fn), operands)
    # (Names here and below are distinct from the branches' and body's: dynamo names the inputs it
    # lifts into a nested cond / while_loop after the variables that held them, and two inputs of
    # one name make it fail "duplicate argument 'out' in function definition".)
    for i, cond_out in zip(outputs, outs, strict=False):
        if i in extend:
            values[i].extend(cond_out)  # in place, as list.append is
        else:
            values[i] = _from_carry(cond_out, values[i], limits.get(i))
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


def _differentiating() -> bool:
    """Whether autograd records this call (an export traces inference: no workaround there)."""
    return torch.is_grad_enabled() and not torch.compiler.is_exporting()


def IfExp(pred: Any, true_fn: Callable, false_fn: Callable, where: str, select: bool = False) -> Any:
    """``a if pred else b``; with a tensor ``pred``, a ``torch.cond`` of the two values."""
    if not _is_tensor(pred):
        return true_fn() if pred else false_fn()
    (value,) = IfElse(pred, lambda _: (true_fn(),), lambda _: (false_fn(),), (None,), ("<expr>",), ("<expr>",),
                      where, select)
    return value


# --- while -------------------------------------------------------------------------------------
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
        if _is_tensor(pred):
            if probing():
                return _probe_iteration(body_fn, values, names, where, bound)
            return _tensor_while(cond_fn, body_fn, values, names, where, bound)
        if not pred:
            return values
        values = tuple(body_fn(*values))


def _loop_local_reason(where: str) -> str:
    """Why a name first assigned inside a tensor loop has no value after it."""
    return f"it is assigned inside the tensor 'while' at {where} but has no value before the loop; initialise it before the loop"


def _probe_iteration(body_fn: Callable, values: tuple, names: tuple[str, ...], where: str, bound: Any) -> tuple:
    """A probe of a tensor loop, as the real ``while_loop`` would leave it: one iteration's values;
    a name with no value before the loop stays without one (a return value excepted, as the
    runtime fills it in); a list appended in the loop becomes a tensor array with room for
    ``bound`` iterations (a Python int here: the probe also runs when shapes are symbolic only
    inside the real loop); a number becomes a 0-d tensor."""
    outs = body_fn(*_copy_lists(values))
    merged = []
    for before, after, name in zip(values, outs, names, strict=True):
        if _is_undefined(before) and not name.startswith(RETURN_PREFIX):
            after = UndefinedVar(name, _loop_local_reason(where))
        elif _growth(before, after) > 0:
            array = _loop_array(before, after, bound, name, where)
            after = TensorArray(array.buffer, array.count, _count(before) + bound * _growth(before, after))
        merged.append(_as_tensor(after) if isinstance(after, _NUMBER) else after)
    return tuple(merged)


def _tensor_while(cond_fn: Callable, body_fn: Callable, args: tuple, names: tuple[str, ...],
                  where: str, bound: Any) -> tuple:
    values = list(args)
    per_iteration: dict[int, tuple] = {}
    returns = [i for i, v in enumerate(values) if _is_undefined(v) and names[i].startswith(RETURN_PREFIX)]
    appended = [i for i, v in enumerate(values) if isinstance(v, (list, TensorArray))]
    if returns or appended:
        outs = probe(body_fn, *_copy_lists(values))
        for i in returns:
            if _carriable(outs[i]):
                values[i] = _zeros_like(outs[i])
        for i in appended:
            grow = _growth(values[i], outs[i])
            if grow > 0:
                # Most elements at the start of any iteration, and after the loop.
                per_iteration[i] = (_count(values[i]) + (bound - 1) * grow if bound is not None else None,
                                    _count(values[i]) + bound * grow if bound is not None else None)
                values[i] = _loop_array(values[i], outs[i], bound, names[i], where)
    carried, locals_, fixed = [], [], []
    for i, value in enumerate(values):
        if _carriable(value):
            carried.append(i)
        elif _is_undefined(value):
            locals_.append(i)
        else:
            fixed.append(i)
    init = tuple(_to_carry(values[i]) for i in carried)
    # Tensor arrays' limits inside an iteration. Computed here: an outer tensor read inside the
    # body (even for its shape) becomes an extra input of the loop, aliasing a carry.
    limits = {i: during for i, (during, _) in per_iteration.items()}

    def fill(ops: Sequence[Any]) -> list:
        by_slot = dict(zip(carried, ops, strict=False))
        return [_from_carry(by_slot[i], a, limits.get(i)) if i in by_slot else a for i, a in enumerate(values)]

    def cond(*ops: Any) -> torch.Tensor:
        pred = cond_fn(*fill(ops))
        return _scalar_pred(pred, "while", where) if _is_tensor(pred) else _as_tensor(bool(pred))

    def body(*ops: Any) -> tuple:
        outs = body_fn(*fill(ops))
        _unchanged(outs, values, fixed, names, "while", where)
        inputs = pytree.tree_leaves(ops)
        result = []
        for i, op in zip(carried, ops, strict=False):
            if not _carriable(outs[i]):
                raise _no_new_element(names, i, "while", where)
            body_out = _to_carry(outs[i], op)
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

    outs = _call_hop(torch.while_loop, "while", where, cond, body, init)
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
    outs = _clone_tree(tuple(outs))
    for i, loop_out in zip(carried, outs, strict=True):
        values[i] = _from_carry(loop_out, values[i], per_iteration[i][1] if i in per_iteration else None)
    for i in locals_:
        values[i] = UndefinedVar(names[i], _loop_local_reason(where))
    return tuple(values)


def LoopTest(broke: Any, test: Callable[[], Any]) -> Any:
    """A loop's condition once it has a ``break`` flag: stop when broken, else ``test()``."""
    if not _is_tensor(broke):
        return False if broke else test()
    value = test()
    if not _is_tensor(value):
        # A Python loop (unrolled) whose break depends on a tensor: iterate to its Python bound;
        # the body is guarded by the flag, so the iterations after the break do nothing.
        return value
    return torch.logical_and(torch.logical_not(broke), value)


# --- for ---------------------------------------------------------------------------------------
class TensorRange:
    """``range(start, stop, step)`` where ``start`` or ``stop`` is a tensor (``step`` a Python int)."""

    def __init__(self, start: Any, stop: Any, step: int, where: str):
        if _is_tensor(step) or not isinstance(step, int) or step == 0:
            raise Dy2StaticError(f"{where}: range() over tensors needs a non-zero Python int step, got {step!r}")
        self.start, self.stop, self.step = start, stop, step


def Range(*args: Any, where: str = "range") -> Any:
    """``range`` that accepts tensor bounds (then iterated by a ``torch.while_loop``)."""
    if not any(_is_tensor(a) for a in args):
        return builtins.range(*args)
    if len(args) == 1:
        return TensorRange(0, args[0], 1, where)
    return TensorRange(args[0], args[1], args[2] if len(args) > 2 else 1, where)


class ForIter:
    """What a converted ``for`` iterates: a Python sequence by Python index, a tensor (its first
    dimension), a tensor ``range`` or a tensor array by tensor index."""

    def __init__(self, iterable: Any, where: str):
        self.where = where
        self.range = iterable if isinstance(iterable, TensorRange) else None
        # A copy: the iterable is often a view (`for v in x[i]`), and a loop body that reads both
        # it and its base makes torch.while_loop refuse two aliasing inputs.
        self.tensor = iterable.clone() if _is_tensor(iterable) else None
        self.array = iterable if isinstance(iterable, TensorArray) else None
        if self.range is None and self.tensor is None and self.array is None:
            seq = (list, tuple, builtins.range)
            self.items = iterable if isinstance(iterable, seq) else list(iterable)
        if self.tensor is not None and self.tensor.dim() == 0:
            raise Dy2StaticError(f"{where}: cannot iterate over a 0-d tensor")

    def _python(self) -> bool:
        return self.range is None and self.tensor is None and (
            self.array is None or not _is_tensor(self.array.count))

    def start(self) -> Any:
        return 0 if self._python() else torch.zeros((), dtype=torch.int64)

    def bound(self) -> Any:
        """The most iterations this loop can run (None when only the run decides: a tensor range)."""
        if self.range is not None:
            return None
        if self.tensor is not None:
            return self.tensor.shape[0]
        if self.array is not None:
            return self.array.capacity
        return len(self.items)

    def has_next(self, idx: Any) -> Any:
        if self.range is not None:
            r = self.range
            pos = r.start + idx * r.step
            return pos < r.stop if r.step > 0 else pos > r.stop
        if self.tensor is not None:
            return idx < self.tensor.shape[0]
        if self.array is not None:
            return idx < self.array.count
        if _is_tensor(idx):
            raise Dy2StaticError(f"{self.where}: a loop over a Python sequence cannot be driven by a tensor")
        return idx < len(self.items)

    def get(self, idx: Any) -> Any:
        if self.range is not None:
            return self.range.start + idx * self.range.step
        if self.tensor is not None:
            # index_select, not tensor[idx]: indexing by a 0-d tensor asks for its integer value,
            # which a graph loop does not have.
            return self.tensor.index_select(0, idx.reshape(1)).squeeze(0)
        if self.array is not None:
            return self.array.get(idx)
        return self.items[idx]


# --- tensor indices ----------------------------------------------------------------------------
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


# --- .item() / float() / int() / bool() in a condition -----------------------------------------
def _one(value: torch.Tensor, what: str, where: str) -> torch.Tensor:
    if value.numel() != 1:
        raise Dy2StaticError(f"{where}: {what} of a tensor with {value.numel()} elements; it needs exactly one. "
                             "Reduce it first (.sum(), .any(), .all()).")
    return value.reshape(())


def Item(value: Any, where: str) -> Any:
    """``value.item()`` in a condition: a 0-d tensor, so the comparison stays in the graph.
    Floating values widen to float64, the precision of the Python float they stand for."""
    if not _is_tensor(value):
        return value.item()
    value = _one(value, ".item()", where)
    return value.to(torch.float64) if value.is_floating_point() else value


def Float(value: Any, where: str) -> Any:
    """``float(value)`` in a condition: a float64 0-d tensor for a tensor."""
    return _one(value, "float()", where).to(torch.float64) if _is_tensor(value) else builtins.float(value)


def Int(value: Any, where: str) -> Any:
    """``int(value)`` in a condition: an int64 0-d tensor (truncated toward zero) for a tensor."""
    if not _is_tensor(value):
        return builtins.int(value)
    value = _one(value, "int()", where)
    return value.trunc().to(torch.int64) if value.is_floating_point() else value.to(torch.int64)


def Bool(value: Any, where: str) -> Any:
    """``bool(value)`` in a condition: a bool 0-d tensor for a tensor."""
    return _one(value, "bool()", where) != 0 if _is_tensor(value) else builtins.bool(value)


# --- lists appended under tensor control flow ----------------------------------------------------
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


# --- logical operators -------------------------------------------------------------------------
def And(left: Any, right: Callable[[], Any]) -> Any:
    """``left and right()``: short-circuit for Python values, ``logical_and`` for tensors."""
    if not _is_tensor(left):
        return left and right()
    return torch.logical_and(left, _as_tensor(right()))


def Or(left: Any, right: Callable[[], Any]) -> Any:
    """``left or right()``: short-circuit for Python values, ``logical_or`` for tensors."""
    if not _is_tensor(left):
        return left or right()
    return torch.logical_or(left, _as_tensor(right()))


def Not(value: Any) -> Any:
    """``not value``, or ``logical_not`` for a tensor."""
    return torch.logical_not(value) if _is_tensor(value) else not value


# --- assert / print ----------------------------------------------------------------------------
def Assert(cond: Any, message: Callable[[], Any], where: str) -> None:
    """``assert``; a tensor condition is checked inside the graph (``torch._assert_async``)."""
    if probing():
        return  # a probe takes paths the program may never take: checking there proves nothing
    if not _is_tensor(cond):
        if not cond:
            msg = message()
            raise AssertionError(msg if msg is not None else f"assertion failed at {where}")
        return
    msg = message()
    text = f"{where}: {msg}" if isinstance(msg, str) else f"assertion failed at {where}"
    torch._assert_async(cond.all() if cond.numel() != 1 else cond.reshape(()).bool(), text)


def Print(token: Any, where: str, *args: Any, sep: str = " ", end: str = "\n", file: Any = None,
          flush: bool = False) -> Any:
    """``print(*args, ...)``, printed where and when it runs (``sampan.jit.printing``); returns
    the print token converted code carries (``_jst_printed``). Nothing prints in a probe or in an
    export (a saved program has no print)."""
    if probing() or torch.compiler.is_exporting():
        return token
    if torch.compiler.is_compiling():
        return printing.print_in_graph(args, sep, end, printing.file_key(file))
    builtins.print(*args, sep=sep, end=end, file=file, flush=flush)
    return token

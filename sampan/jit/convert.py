"""Runtime converters: what the AST passes' generated calls do when the code runs.

Each converter decides per call, from the values it sees: a Python predicate runs as plain
Python (inside ``torch.compile`` the graph specialises on it or unrolls the loop), a tensor
predicate becomes ``torch.cond`` / ``torch.while_loop``. Converted code refers to this module as
``_jst`` (Paddle's name for the same role).

Rules for variables under tensor control flow (they follow from what one graph can express):

- A tensor, or a Python number (which becomes a 0-d tensor), is carried through the
  ``cond`` / ``while_loop``; it must keep its shape and dtype.
- A name with no value before a tensor ``if`` is an output when *both* branches assign it;
  assigned in one branch only, it is local to that branch and undefined after the ``if``.
- A name with no value before a tensor ``while`` is local to one iteration.
- Other Python objects (lists, layers, None, strings) are read-only inside tensor control flow.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from sampan.jit import torch_fixes  # noqa: F401 - applies the cond / while_loop backward fixes
from sampan.jit.errors import Dy2StaticError

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
    pred = pred.reshape(())
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


def _call_hop(op: Callable, *args: Any) -> Any:
    """Run ``torch.cond`` / ``torch.while_loop``; outside compilation, surface a
    :class:`Dy2StaticError` raised in a branch or body as itself (torch wraps it in a tracing error)."""
    if torch.compiler.is_compiling():
        return op(*args)
    try:
        return op(*args)
    except torch._dynamo.exc.TorchDynamoException as e:
        found = re.search(r'raised exception Dy2StaticError\((["\'])(.*?)\1\)', str(e), re.S)
        if found:
            raise Dy2StaticError(found.group(2)) from None
        raise


def _unalias(out: torch.Tensor, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    # torch.cond / while_loop refuse a branch output that is one of its inputs (aliasing).
    return out.clone() if any(out is t for t in inputs) else out


def _unchanged(outs: Sequence[Any], args: Sequence[Any], idx: Sequence[int], names: Sequence[str],
               what: str, where: str) -> None:
    for i in idx:
        if outs[i] is not args[i]:
            raise Dy2StaticError(
                f"{where}: '{names[i]}' holds a {type(args[i]).__name__} and is reassigned inside this "
                f"tensor '{what}'; only tensors and numbers can change under a tensor condition. Make it a "
                "tensor, or compute it outside the condition.")


# --- if / else ---------------------------------------------------------------------------------
def IfElse(pred: Any, true_fn: Callable, false_fn: Callable, args: tuple, names: tuple[str, ...],
           both: tuple[str, ...], where: str, select: bool = False) -> tuple:
    """Run ``true_fn(*args)`` or ``false_fn(*args)``; with a tensor ``pred``, as one ``torch.cond``.

    ``select`` (set by the ``ifelse`` pass for an ``if`` inside a loop whose branches only
    compute): while exporting, run both branches and pick each output with ``torch.where``
    instead, because the torch 2.13 ONNX exporter fails on an ``If`` inside a ``Loop`` body
    ("Opset mismatch when inlining function ... __subgraph__"). The values are the same; both
    branches' work is done. Outputs whose shapes or dtypes differ between the branches keep the
    ``torch.cond``.
    """
    if not _is_tensor(pred):
        return true_fn(*args) if pred else false_fn(*args)
    pred = _scalar_pred(pred, "if", where)
    inputs, outputs, locals_, fixed = [], [], [], []
    for i, (name, value) in enumerate(zip(names, args, strict=False)):
        if _is_tensor(value) or isinstance(value, _NUMBER):
            inputs.append(i)
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
    if not outputs:
        raise Dy2StaticError(
            f"{where}: this 'if' has a tensor condition but assigns no tensor, so a graph cannot express "
            "it (side effects such as raise or list.append cannot be conditional on a tensor). Assign "
            "the result to a variable in both branches, or use 'assert' for checks.")
    operands = tuple(_as_tensor(args[i]) for i in inputs)

    def branch(fn: Callable) -> Callable:
        def run(*ops: torch.Tensor) -> tuple:
            # Outer tensors must not be touched inside the branch (dynamo would lift them as
            # extra inputs), so the operand slots are filled without reading ``args`` there.
            by_slot = dict(zip(inputs, ops, strict=False))
            values = [by_slot[i] if i in by_slot else a for i, a in enumerate(args)]
            outs = fn(*values)
            _unchanged(outs, args, fixed, names, "if", where)
            result = []
            for i in outputs:
                out = outs[i]
                if isinstance(out, _NUMBER):
                    out = _as_tensor(out, operands[inputs.index(i)] if i in inputs else None)
                if not _is_tensor(out):
                    raise Dy2StaticError(
                        f"{where}: under this tensor 'if', '{names[i]}' must be a tensor (or number) in "
                        f"both branches, but one branch leaves it {out!r}. Give it a tensor value in both.")
                # A branch output may be an outer tensor (``if c: return y``), which torch.cond
                # refuses as aliasing and we cannot tell from a fresh one while tracing: copy it
                # (inductor fuses the copy into the op that produced the value).
                result.append(out.clone())
            return tuple(result)

        return run

    outs = None
    if select and torch.compiler.is_exporting():
        outs = _select(pred, branch(true_fn)(*operands), branch(false_fn)(*operands))
    if outs is None:
        outs = _call_hop(torch.cond, pred, branch(true_fn), branch(false_fn), operands)
    values = list(args)
    for i, out in zip(outputs, outs, strict=False):
        values[i] = out
    for i in locals_:
        values[i] = UndefinedVar(names[i], f"it is assigned in only one branch of the tensor 'if' at {where} "
                                           "and has no value before it; assign it before the 'if' or in "
                                           "both branches")
    return tuple(values)


def _select(pred: torch.Tensor, if_true: tuple, if_false: tuple) -> tuple | None:
    """``torch.where(pred, t, f)`` per output, or None if an output's shape or dtype differs."""
    if any(t.shape != f.shape or t.dtype != f.dtype for t, f in zip(if_true, if_false, strict=True)):
        return None
    # onnxruntime has no Where kernel for bool tensors (a break flag): select those with logic.
    return tuple(torch.logical_or(torch.logical_and(pred, t), torch.logical_and(torch.logical_not(pred), f))
                 if t.dtype == torch.bool else torch.where(pred, t, f)
                 for t, f in zip(if_true, if_false, strict=True))


def _differentiating() -> bool:
    """Whether autograd records this call (an export traces inference: no workaround there)."""
    return torch.is_grad_enabled() and not torch.compiler.is_exporting()


def IfExp(pred: Any, true_fn: Callable, false_fn: Callable, where: str, select: bool = False) -> Any:
    """``a if pred else b``; with a tensor ``pred``, a ``torch.cond`` of the two values."""
    if not _is_tensor(pred):
        return true_fn() if pred else false_fn()
    (out,) = IfElse(pred, lambda _: (true_fn(),), lambda _: (false_fn(),), (None,), ("<expr>",), ("<expr>",),
                    where, select)
    return out


# --- while -------------------------------------------------------------------------------------
def While(cond_fn: Callable, body_fn: Callable, args: tuple, names: tuple[str, ...], where: str) -> tuple:
    """Loop ``args = body_fn(*args)`` while ``cond_fn(*args)``; as ``torch.while_loop`` once the
    condition is a tensor (a loop may start in Python and switch when a tensor enters its state)."""
    values = tuple(args)
    while True:
        pred = cond_fn(*values)
        if _is_tensor(pred):
            return _tensor_while(cond_fn, body_fn, values, names, where)
        if not pred:
            return values
        values = tuple(body_fn(*values))


def _tensor_while(cond_fn: Callable, body_fn: Callable, args: tuple, names: tuple[str, ...],
                  where: str) -> tuple:
    carried, locals_, fixed = [], [], []
    for i, value in enumerate(args):
        if _is_tensor(value) or isinstance(value, _NUMBER):
            carried.append(i)
        elif _is_undefined(value):
            locals_.append(i)
        else:
            fixed.append(i)
    init = tuple(_as_tensor(args[i]) for i in carried)

    def fill(ops: Sequence[torch.Tensor]) -> list:
        by_slot = dict(zip(carried, ops, strict=False))
        return [by_slot[i] if i in by_slot else a for i, a in enumerate(args)]

    def cond(*ops: torch.Tensor) -> torch.Tensor:
        pred = cond_fn(*fill(ops))
        return _scalar_pred(pred, "while", where) if _is_tensor(pred) else _as_tensor(bool(pred))

    def body(*ops: torch.Tensor) -> tuple:
        outs = body_fn(*fill(ops))
        _unchanged(outs, args, fixed, names, "while", where)
        result = []
        for i, op in zip(carried, ops, strict=False):
            out = _as_tensor(outs[i], op) if isinstance(outs[i], _NUMBER) else outs[i]
            if not _is_tensor(out) or out.dtype != op.dtype or out.shape != op.shape:
                got = f"{out.dtype} {list(out.shape)}" if _is_tensor(out) else repr(out)
                raise Dy2StaticError(
                    f"{where}: '{names[i]}' enters this tensor 'while' as {op.dtype} {list(op.shape)} and "
                    f"leaves an iteration as {got}; a graph loop keeps each variable's shape and dtype. "
                    "Preallocate it at full size (and cast) before the loop.")
            result.append(_unalias(out, ops))
        return tuple(result)

    outs = _call_hop(torch.while_loop, cond, body, init)
    if _differentiating() and any(out.requires_grad for out in outs):
        # torch 2.13: when the loop runs zero times, while_loop's backward still applies one
        # iteration's backward to the initial values (x * 2 in the body: dx = 2, not 1). The
        # outputs then equal the initial values; selecting those when the condition fails at
        # the start routes the gradient around the loop.
        ran = cond(*init)
        outs = tuple(torch.where(ran, out, start) if out.is_floating_point() else out
                     for out, start in zip(outs, init, strict=True))
    # torch 2.13: a while_loop output that depends on module parameters carries unbacked stride
    # symbols, and a later torch.cond that reads it fails to lift them ("Source of '8*u0 - 8' is
    # None"). A copy has plain metadata; it costs one copy per loop, not per iteration.
    values = fill(tuple(out.clone() for out in outs))
    for i in locals_:
        reason = (f"it is assigned inside the tensor 'while' at {where} but has no value before the loop; "
                  "initialise it before the loop")
        if names[i] == "_jst_retval":
            reason = (f"a 'return' inside the tensor-driven loop at {where} cannot leave the graph loop; "
                      "assign the result to a variable initialised before the loop, 'break', and return "
                      "it after the loop")
        values[i] = UndefinedVar(names[i], reason)
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


def Range(*args: Any) -> Any:
    """``range`` that accepts tensor bounds (then iterated by a ``torch.while_loop``)."""
    if not any(_is_tensor(a) for a in args):
        return builtins.range(*args)
    if len(args) == 1:
        return TensorRange(0, args[0], 1, "range")
    return TensorRange(args[0], args[1], args[2] if len(args) > 2 else 1, "range")


class ForIter:
    """What a converted ``for`` iterates: a Python sequence by Python index, a tensor (its first
    dimension) or a tensor ``range`` by tensor index."""

    def __init__(self, iterable: Any, where: str):
        self.where = where
        self.range = iterable if isinstance(iterable, TensorRange) else None
        self.tensor = iterable if _is_tensor(iterable) else None
        if self.range is None and self.tensor is None:
            seq = (list, tuple, builtins.range)
            self.items = iterable if isinstance(iterable, seq) else list(iterable)
        if self.tensor is not None and self.tensor.dim() == 0:
            raise Dy2StaticError(f"{where}: cannot iterate over a 0-d tensor")

    def start(self) -> Any:
        python = self.range is None and self.tensor is None
        return 0 if python else torch.zeros((), dtype=torch.int64)

    def has_next(self, idx: Any) -> Any:
        if self.range is not None:
            r = self.range
            pos = r.start + idx * r.step
            return pos < r.stop if r.step > 0 else pos > r.stop
        if self.tensor is not None:
            return idx < self.tensor.shape[0]
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
        return self.items[idx]


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
    if not _is_tensor(cond):
        if not cond:
            msg = message()
            raise AssertionError(msg if msg is not None else f"assertion failed at {where}")
        return
    msg = message()
    text = f"{where}: {msg}" if isinstance(msg, str) else f"assertion failed at {where}"
    torch._assert_async(cond.all() if cond.numel() != 1 else cond.reshape(()).bool(), text)


def _print(*args: Any, **kwargs: Any) -> None:
    builtins.print(*args, **kwargs)


# Registered with torch.compile as a logging function: inside a graph the call is moved to after
# the graph runs (with the real tensor values) instead of breaking the graph.
torch._dynamo.config.reorderable_logging_functions.add(_print)


def Print(*args: Any, **kwargs: Any) -> None:
    """``print`` that does not break the graph when given tensors."""
    _print(*args, **kwargs)

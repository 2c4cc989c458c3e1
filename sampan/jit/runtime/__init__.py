"""Runtime converters: what the AST passes' generated calls do when the code runs.

Converted code refers to this package as ``_jst`` (Paddle's name for the same role) and calls
the names below, one file per construct, each named after the pass (``sampan.jit.passes``)
that generates its calls. Each converter decides per call, from the values it sees: a Python
predicate runs as plain Python (inside ``torch.compile`` the graph specialises on it or unrolls
the loop), a tensor predicate becomes ``torch.cond`` / ``torch.while_loop``.

Rules for variables under tensor control flow (they follow from what one graph can express):

- A tensor, a Python number (which becomes a 0-d tensor) or a tuple of those is carried through
  the ``cond`` / ``while_loop`` (``carry``); through a loop it must keep its shape and dtype.
- A name with no value before a tensor ``if`` is an output when *both* branches assign it;
  assigned in one branch only, it is local to that branch and undefined after the ``if``.
- A name with no value before a tensor ``while`` is local to one iteration. The return value of
  a ``return`` inside the loop is the exception: a probe of the body (``sampan.jit.probe``)
  gives its shape, and the loop carries it from a zero value.
- A list appended under a tensor condition is carried as a :class:`TensorArray` (``arrays``; or,
  when both branches of an ``if`` append the same number of same-shaped tensors, the new
  elements are outputs of the ``cond``). Other Python objects (layers, ``None``, strings) are
  read-only.
"""

from sampan.jit.runtime.assert_stmt import Assert
from sampan.jit.runtime.break_continue import LoopTest
from sampan.jit.runtime.cast import Bool, Float, Int, Item
from sampan.jit.runtime.for_loop import ForIter, Range, TensorRange
from sampan.jit.runtime.ifelse import IfElse, IfExp
from sampan.jit.runtime.list_append import Append, Cat, Len, ListValue, Stack
from sampan.jit.runtime.logical import And, Not, Or
from sampan.jit.runtime.print_call import Print
from sampan.jit.runtime.tensor_index import GetItem, SetItem
from sampan.jit.runtime.undefined_vars import UndefinedVar
from sampan.jit.runtime.while_loop import While

__all__ = [
    "And", "Append", "Assert", "Bool", "Cat", "Float", "ForIter", "GetItem", "IfElse", "IfExp", "Int", "Item",
    "Len", "ListValue", "LoopTest", "Not", "Or", "Print", "Range", "SetItem", "Stack", "TensorRange",
    "UndefinedVar", "While",
]

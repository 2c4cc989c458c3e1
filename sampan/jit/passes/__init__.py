"""The AST passes of ``to_static``, one per file, in the order they run.

Each pass takes the module holding the function's definition and a :class:`PassContext` and
returns the transformed module; the source after every pass is valid Python (printed with
``SAMPAN_JIT_DEBUG=1``). The order matters:

1. ``decorators`` / ``type_hints`` take off what the converted function does not run with
   (decorators are re-applied to it; hints are dropped).
2. ``check_unsupported`` refuses what cannot be converted, before anything is rewritten.
3. ``cast`` keeps ``.item()`` / ``float()`` / ``int()`` / ``bool()`` in conditions tensors, before
   ``assert_stmt`` / ``print_call`` route asserts and prints through runtime helpers.
4. ``tensor_index`` / ``list_append`` turn subscripts and appends into runtime calls that
   assign, so that the names they change are carried by the control flow passes below.
5. ``loop_return`` turns returns inside loops into ``break`` + flag, which ``early_return``
   then lifts out of ``if``s so every path ends in one assignment to the return value.
6. ``for_loop`` makes every ``for`` a ``while``; ``break_continue`` then only sees ``while``.
7. ``call`` resolves calls to user functions to their converted versions.
8. ``logical`` rewrites ``and`` / ``or`` / ``not`` (including those the passes above added).
9. ``ifelse`` then ``while_loop`` turn the control flow into runtime converter calls.
10. ``undefined_vars`` gives carried names a placeholder value at the top of their function.
"""

from __future__ import annotations

from sampan.jit.passes import (
    assert_stmt,
    break_continue,
    call,
    cast,
    check_unsupported,
    decorators,
    early_return,
    for_loop,
    ifelse,
    list_append,
    logical,
    loop_return,
    print_call,
    tensor_index,
    type_hints,
    undefined_vars,
    while_loop,
)
from sampan.jit.passes.base import ConversionError, PassContext

# Passes that only normalise the source: a function they alone change is not "converted".
NORMALISING = ("decorators", "type_hints")

PASSES = (
    ("decorators", decorators.apply),
    ("type_hints", type_hints.apply),
    ("check_unsupported", check_unsupported.apply),
    ("cast", cast.apply),
    ("assert_stmt", assert_stmt.apply),
    ("print_call", print_call.apply),
    ("tensor_index", tensor_index.apply),
    ("list_append", list_append.apply),
    ("loop_return", loop_return.apply),
    ("early_return", early_return.apply),
    ("for_loop", for_loop.apply),
    ("break_continue", break_continue.apply),
    ("call", call.apply),
    ("logical", logical.apply),
    ("ifelse", ifelse.apply),
    ("while_loop", while_loop.apply),
    ("undefined_vars", undefined_vars.apply),
)

__all__ = ["NORMALISING", "PASSES", "ConversionError", "PassContext"]

"""The AST passes of ``to_static``, one per file, in the order they run.

Each pass takes the module holding the function's definition and a :class:`PassContext` and
returns the transformed module; the source after every pass is valid Python (printed with
``SAMPAN_JIT_DEBUG=1``). The order matters:

1. ``check_unsupported`` refuses what cannot be converted, before anything is rewritten.
2. ``assert_stmt`` / ``print_call`` route asserts and prints through runtime helpers.
3. ``loop_return`` turns returns inside loops into ``break`` + flag, which ``early_return``
   then lifts out of ``if``s so every path ends in one assignment to the return value.
4. ``for_loop`` makes every ``for`` a ``while``; ``break_continue`` then only sees ``while``.
5. ``call`` resolves calls to user functions to their converted versions.
6. ``logical`` rewrites ``and`` / ``or`` / ``not`` (including those the passes above added).
7. ``ifelse`` then ``while_loop`` turn the control flow into runtime converter calls.
8. ``undefined_vars`` gives carried names a placeholder value at the top of their function.
"""

from __future__ import annotations

from sampan.jit.passes import (
    assert_stmt,
    break_continue,
    call,
    check_unsupported,
    early_return,
    for_loop,
    ifelse,
    logical,
    loop_return,
    print_call,
    undefined_vars,
    while_loop,
)
from sampan.jit.passes.base import ConversionError, PassContext

PASSES = (
    ("check_unsupported", check_unsupported.apply),
    ("assert_stmt", assert_stmt.apply),
    ("print_call", print_call.apply),
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

__all__ = ["PASSES", "ConversionError", "PassContext"]

"""Run a higher-order op (``torch.cond`` / ``torch.while_loop``) that converted code builds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sampan.jit import torch_fixes  # noqa: F401 - applies the cond / while_loop backward fixes
from sampan.jit.diagnose import dy2static_errors


def call_hop(op: Callable, what: str, where: str, *args: Any) -> Any:
    """Run ``torch.cond`` / ``torch.while_loop``. Outside dynamo's tracing (eager runs, export),
    a :class:`Dy2StaticError` raised in a branch or body surfaces as itself (torch wraps it in a
    tracing error), and any other failure becomes one naming this construct."""
    if torch.compiler.is_dynamo_compiling():
        return op(*args)  # while dynamo traces, its error is reported by the compiled call (StaticFunction)
    with dy2static_errors(f"this tensor '{what}' could not be converted", where):
        return op(*args)

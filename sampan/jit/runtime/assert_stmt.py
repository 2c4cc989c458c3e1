"""``_jst.Assert`` (``assert_stmt`` pass): a Python ``assert``, or a check inside the graph for a
tensor condition."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sampan.jit.probe import probing
from sampan.jit.runtime.values import is_tensor


def Assert(cond: Any, message: Callable[[], Any], where: str) -> None:
    """``assert``; a tensor condition is checked inside the graph (``torch._assert_async``)."""
    if probing():
        return  # a probe takes paths the program may never take: checking there proves nothing
    if not is_tensor(cond):
        if not cond:
            msg = message()
            raise AssertionError(msg if msg is not None else f"assertion failed at {where}")
        return
    msg = message()
    text = f"{where}: {msg}" if isinstance(msg, str) else f"assertion failed at {where}"
    torch._assert_async(cond.all() if cond.numel() != 1 else cond.reshape(()).bool(), text)

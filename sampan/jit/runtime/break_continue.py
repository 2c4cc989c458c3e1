"""``_jst.LoopTest`` (``break_continue`` pass): a loop's condition once a ``break`` sets a flag."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from sampan.jit.runtime.values import is_tensor


def LoopTest(broke: Any, test: Callable[[], Any]) -> Any:
    """A loop's condition once it has a ``break`` flag: stop when broken, else ``test()``."""
    if not is_tensor(broke):
        return False if broke else test()
    value = test()
    if not is_tensor(value):
        # A Python loop (unrolled) whose break depends on a tensor: iterate to its Python bound;
        # the body is guarded by the flag, so the iterations after the break do nothing.
        return value
    return torch.logical_and(torch.logical_not(broke), value)

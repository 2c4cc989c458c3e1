"""``_jst.Print`` (``print_call`` pass): a ``print`` that prints where and when it runs, also
inside a ``torch.cond`` branch or a ``torch.while_loop`` body (``sampan.jit.printing``)."""

from __future__ import annotations

import builtins
from typing import Any

import torch

from sampan.jit import printing
from sampan.jit.probe import probing


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

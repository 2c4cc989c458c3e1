"""Errors of ``sampan.jit``: each names the user's ``file:line`` and says what to change."""

from __future__ import annotations

from sampan.jit.passes.base import ConversionError


class Dy2StaticError(RuntimeError):
    """Raised while running converted code: a construct that works in Python but not in a graph."""


class GraphBreakError(RuntimeError):
    """``torch.compile(fullgraph=True)`` refused the converted function (a graph break)."""


__all__ = ["ConversionError", "Dy2StaticError", "GraphBreakError"]

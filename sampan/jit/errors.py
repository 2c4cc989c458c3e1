"""Errors of ``sampan.jit``: each names the user's ``file:line``, the construct, and what to change.

:class:`Dy2StaticError` is the one class callers catch: conversion errors (from the source),
errors while running converted code, capture failures (``torch.compile`` / ``torch.export``)
and their subclasses all derive from it. A torch error behind one is chained as its cause.
"""

from __future__ import annotations

from sampan.jit.passes.base import ConversionError, Dy2StaticError


class GraphBreakError(Dy2StaticError):
    """``torch.compile(fullgraph=True)`` refused the converted function (a graph break), although
    the converted function runs eagerly."""


class ExportError(Dy2StaticError):
    """``jit.save`` could not export the converted function with ``torch.export``."""


__all__ = ["ConversionError", "Dy2StaticError", "ExportError", "GraphBreakError"]

"""``sampan.jit``: dynamic-to-static conversion, graph caching, and export.

``to_static`` rewrites a function's tensor-dependent ``if`` / ``while`` / ``for`` / ``break`` /
``return`` into ``torch.cond`` / ``torch.while_loop`` by AST passes (``sampan.jit.passes``, one
per file), with runtime converters (``sampan.jit.convert``) choosing Python or graph control flow
per call, and runs the result through ``torch.compile(fullgraph=True)``. ``save`` exports it to
``.pt2`` (torch.export) and ``.onnx``; ``load`` runs an export without the original source.
"""

from sampan.jit.api import not_to_static, to_static
from sampan.jit.errors import ConversionError, Dy2StaticError, GraphBreakError
from sampan.jit.export import LoadedFunction, load, save
from sampan.jit.static_function import StaticFunction
from sampan.static import InputSpec

__all__ = [
    "ConversionError",
    "Dy2StaticError",
    "GraphBreakError",
    "InputSpec",
    "LoadedFunction",
    "StaticFunction",
    "load",
    "not_to_static",
    "save",
    "to_static",
]

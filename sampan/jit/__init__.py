"""``sampan.jit``: dynamic-to-static conversion, graph caching, and export.

``to_static`` rewrites a function's tensor-dependent ``if`` / ``while`` / ``for`` / ``break`` /
``return``, tensor indices, appended lists and ``.item()`` conditions into ``torch.cond`` /
``torch.while_loop`` / ``index_select`` / tensor arrays by AST passes (``sampan.jit.passes``, one
per file), with runtime converters (``sampan.jit.runtime``) choosing Python or graph control flow
per call, and runs the result through ``torch.compile(fullgraph=True)``. ``save`` exports it to
``.pt2`` (torch.export) and ``.onnx``; ``load`` runs an export without the original source. Every
failure to convert or capture is a :class:`Dy2StaticError` naming the user's ``file:line``.
"""

from sampan.jit.api import not_to_static, to_static
from sampan.jit.errors import ConversionError, Dy2StaticError, ExportError, GraphBreakError
from sampan.jit.export import LoadedFunction, load, save
from sampan.jit.static_function import StaticFunction
from sampan.static import InputSpec

__all__ = [
    "ConversionError",
    "Dy2StaticError",
    "ExportError",
    "GraphBreakError",
    "InputSpec",
    "LoadedFunction",
    "StaticFunction",
    "load",
    "not_to_static",
    "save",
    "to_static",
]

"""Library code versus the user's: what ``to_static`` leaves as it is and where errors point.

Two questions, one owner:

- :func:`is_library_callable`: a callable the translator finds in user code is called as it is,
  never converted, when its module is one of the library packages below.
- :func:`is_library_file`: a file is library code when it lies under one of the library folders
  below. The translator asks it of a decorator's wrapper (``functools.wraps`` copies the wrapped
  function's ``__module__``, so only the wrapper's file tells it apart), and ``diagnose`` asks it
  of every traceback frame when it looks for the user's ``file:line``.
"""

from __future__ import annotations

import os
import sysconfig
from typing import Any

import torch

# Callables from these packages are library code: called as they are, never converted.
_LIBRARY_MODULES = ("torch", "sampan.jit", "numpy", "builtins", "functools", "typing", "collections",
                    "contextlib", "abc", "onnx", "onnxscript", "onnxruntime", "transformers", "math")

_JIT_DIR = os.path.dirname(os.path.abspath(__file__))
_SAMPAN_DIR = os.path.dirname(_JIT_DIR)
_PATHS = sysconfig.get_paths()
_LIBRARY_DIRS = tuple(sorted({d for d in (
    # The standard library: contextlib / functools frames between a wrapper and the user's call.
    _PATHS.get("stdlib"),
    # Installed packages (site-packages): numpy, onnx, transformers, and torch in a usual install.
    _PATHS.get("purelib"),
    _PATHS.get("platlib"),
    # torch itself wherever it is installed (a --target or PYTHONPATH install lies outside
    # site-packages): dynamo's and torch.export's frames surround every converted call.
    os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))),
    # The converter: its runtime frames sit between the user's lines in every traceback.
    _JIT_DIR,
) if d}))


def _under(path: str, folder: str) -> bool:
    return path.startswith(folder + os.sep)


def is_library_file(filename: str) -> bool:
    """Whether ``filename`` is library code (see the folders above). sampan outside ``sampan.jit``
    is the user's: its models' forwards are converted, and an error in them names their line,
    also when sampan is installed in site-packages."""
    path = os.path.abspath(filename)
    if _under(path, _JIT_DIR):
        return True
    if _under(path, _SAMPAN_DIR):
        return False
    return any(_under(path, d) for d in _LIBRARY_DIRS)


def is_library_callable(obj: Any) -> bool:
    """Whether ``obj``'s module is one of the library packages (so it is never converted)."""
    module = getattr(obj, "__module__", None) or ""
    return any(module == p or module.startswith(p + ".") for p in _LIBRARY_MODULES)

"""``lazy_exports``: a package's names imported from their modules on first use.

Packages whose names pull in torch (or another slow import) export them lazily, so importing the
package stays cheap for code that needs only its light parts (``sampan plan`` reads model
configs without torch).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exporters: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``name`` from ``exporters[name]`` on
    first use and keeps it in the package's namespace (later lookups cost nothing)."""

    def __getattr__(name: str) -> Any:
        if name in exporters:
            module = importlib.import_module(exporters[name])
            # ``{"fleet": "pkg.fleet"}`` exports the submodule itself
            value = module if module.__name__ == f"{package}.{name}" else getattr(module, name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__

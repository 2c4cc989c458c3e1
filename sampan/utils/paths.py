"""Sampan's per-user directories. This module imports nothing from sampan: every layer may use it.

``$SAMPAN_HOME`` (default ``~/.sampan``) holds what the user builds (``models/``), caches
(``cache/``: exported graphs, quantized files) and data builds (``build/``). ``$SAMPAN_CACHE``, when
set, holds the caches instead: what is there is keyed by the contents it was made from, so one
cache can serve several homes (a CI machine's runs, the test suite's private homes).
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """Sampan's per-user directory: ``$SAMPAN_HOME``, default ``~/.sampan``."""
    return Path(os.environ.get("SAMPAN_HOME") or Path.home() / ".sampan").expanduser()


def user_models_dir() -> Path:
    """Where ``sampan hub build`` writes models: ``$SAMPAN_HOME/models``."""
    return home() / "models"


def cache_dir(*parts: str) -> Path:
    """A cache directory under ``$SAMPAN_CACHE``, default ``$SAMPAN_HOME/cache`` (exported graphs,
    quantized files)."""
    root = os.environ.get("SAMPAN_CACHE")
    return (Path(root).expanduser() if root else home() / "cache").joinpath(*parts)

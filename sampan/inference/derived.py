"""Files derived from an exported graph (the int8 quantization, the ORT-fused graph), made on first
use and reused afterwards.

A derived file is written beside its source when that directory is writable (an export the user
made, or Taskflow's export cache). A model shipped inside the installed package is read-only, so
its derived files go to ``$SAMPAN_HOME/cache/<kind>/<sha256 of the source>.onnx`` instead, keyed by
content so that an updated model never reuses a stale derivation. Every file is made in a private
temporary directory and moved into place, so a crash leaves nothing half-written and two processes
deriving at once do not collide.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from sampan.utils.atomic import atomic_path
from sampan.utils.digest import file_sha256
from sampan.utils.paths import cache_dir


def writable(directory: Path) -> bool:
    if not os.access(directory, os.W_OK):
        return False
    try:  # os.access says yes on some read-only mounts; a real probe settles it
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError:
        return False
    return True


def derived_path(source: Path, suffix: str, kind: str, make: Callable[[Path, Path], None], *,
                 remake: bool = False) -> Path:
    """The file derived from ``source`` by ``make``, made on first use.

    Beside the source it is ``<stem><suffix>`` (``inference.onnx`` -> ``inference.int8.onnx``),
    remade when older than the source; in the read-only case it is
    ``$SAMPAN_HOME/cache/<kind>/<sha256>.onnx``. ``remake`` makes it again in either place (the
    caller found the existing file stale by its contents).
    """
    beside = source.with_name(source.name.removesuffix(".onnx") + suffix)
    if not remake and beside.is_file() and beside.stat().st_mtime >= source.stat().st_mtime:
        return beside
    # atomic_path's file lies in a private directory, so make may write scratch files beside it.
    if writable(source.parent):
        with atomic_path(beside) as work:
            make(source, work)
        return beside
    cached = cache_dir(kind) / f"{file_sha256(source)}.onnx"
    if remake or not cached.is_file():
        with atomic_path(cached) as work:
            make(source, work)
    return cached

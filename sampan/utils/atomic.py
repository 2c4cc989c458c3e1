"""Writes that never leave a half-written file or directory where a reader would find it.

``atomic_write`` writes one file (temporary sibling, fsync, rename); ``atomic_dir`` builds a whole
directory in a temporary sibling and swaps it into place, so a crash leaves either the old
directory or the new one, never a mixture.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(directory: str | os.PathLike) -> None:
    """fsync every file under ``directory``, then the directories themselves."""
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(root)


def atomic_write(path: str | os.PathLike, data: str | bytes, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` through a temporary sibling, fsynced and renamed into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode(encoding) if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)
    return path


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``target`` to fill; on success it replaces ``target``.

    On an exception the temporary directory is removed and ``target`` is untouched. An existing
    ``target`` is moved aside, the new one renamed in, then the old one deleted.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        fsync_tree(tmp)
        if target.exists():
            backup = target.with_name(f".{target.name}.old")
            shutil.rmtree(backup, ignore_errors=True)
            target.rename(backup)
            tmp.rename(target)
            shutil.rmtree(backup)
        else:
            tmp.rename(target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

"""Writes that never leave a half-written file or directory where a reader would find it.

The one place in sampan that installs files by temp-then-rename (DESIGN.md principle 6); use it
rather than ``os.replace`` / ``os.rename`` by hand:

- ``atomic_write(path, data)``: a whole file from ``str`` / ``bytes`` in memory.
- ``atomic_open(path, mode)``: a file written bit by bit (a stream, ``numpy.tofile``, ``json.dump``).
- ``atomic_path(path)``: a temporary path for a writer that takes a file name (safetensors'
  ``save_file``, ``torch.save``, matplotlib's ``savefig``, ``onnx.save``).
- ``atomic_dir(target)``: a whole directory, built beside ``target`` and swapped into place.
- ``move_into_place(src, dst)``: the durable rename they all end with, for a file some library
  wrote into a scratch directory.
- ``remove_dir(path)``: delete a directory without ever leaving half of it under its real name.
- ``fsync_dir`` / ``fsync_tree``: the fsyncs that make a rename durable.

In each, data is fsynced before the rename and the directory after it, so a crash (or power loss)
leaves either the old contents or the new, never a mixture. What ``atomic_path`` and ``atomic_dir``
install has at least a plain new file's permissions, whatever mode the writer gave it. Imports nothing from sampan.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (files created or renamed in it) durable.

    A no-op where the platform cannot: Windows cannot open a directory (NTFS journals renames
    itself) and some file systems refuse fsync on one. A missing directory is still an error.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: str | os.PathLike) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_tree(directory: str | os.PathLike) -> None:
    """fsync every file under ``directory``, then the directories themselves."""
    for root, _dirs, files in os.walk(directory):
        for name in files:
            _fsync_file(os.path.join(root, name))
        fsync_dir(root)


def move_into_place(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Rename the finished ``src`` to ``dst`` (same file system), durably; returns ``dst``.

    A file replaces an existing ``dst`` and has its data fsynced first; a directory must be
    complete (``atomic_dir`` fsyncs its own) and ``dst`` absent or empty. ``dst``'s directory is
    fsynced after the rename.
    """
    src, dst = Path(src), Path(dst)
    if src.is_dir():
        os.rename(src, dst)
    else:
        _fsync_file(src)
        os.replace(src, dst)
    fsync_dir(dst.parent)
    return dst


@functools.lru_cache(maxsize=1)
def _new_file_mode() -> int:
    """The mode a plain new file gets here: 0o666 less the process umask (read from /proc, since
    ``os.umask`` can only be read by setting it, which would race other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def _plain_file_mode(path: Path) -> None:
    # Some writers create their file private to the writer (safetensors' save_file: 0600), so a
    # model built into a shared store would be unreadable by its other users; a written file gets
    # at least the permissions any new file gets.
    if path.is_file():
        mode = path.stat().st_mode & 0o777
        if mode | _new_file_mode() != mode:
            os.chmod(path, mode | _new_file_mode())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s new contents at; on success it replaces ``path``.

    For writers that take a file name: ``with atomic_path(p) as tmp: save_file(tensors, tmp)``.
    The temporary file has ``path``'s own name (a writer that goes by the suffix picks the right
    format) inside a private hidden directory beside ``path``, which the writer may also fill with
    scratch files; that directory is removed in every case. On an exception ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        tmp = work / path.name
        yield tmp
        _plain_file_mode(tmp)
        move_into_place(tmp, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file for ``path``'s new contents; leaving the block installs it.

    ``mode`` is ``"w"`` (text in ``encoding``) or ``"wb"``. On an exception ``path`` is untouched
    and no temporary file is left behind.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes a whole new file: mode must be 'w' or 'wb', got {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, encoding=None if mode == "wb" else encoding) as f:
        yield f


def atomic_write(path: str | os.PathLike, data: str | bytes, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` through a temporary sibling, fsynced and renamed into place."""
    with atomic_open(path, "wb") as f:
        f.write(data.encode(encoding) if isinstance(data, str) else data)
    return Path(path)


def _new_dir(parent: Path, prefix: str) -> Path:
    # Not tempfile.mkdtemp: its 0700 mode would stay with the directory once renamed into place.
    while True:
        candidate = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike, *, prefix: str | None = None,
               aside: str | os.PathLike | None = None) -> Iterator[Path]:
    """Yield a new empty sibling of ``target`` to fill; on success it replaces ``target``.

    On an exception the temporary directory is removed and ``target`` is untouched. On success
    everything in it is fsynced; an existing ``target`` is renamed aside, the new one renamed in
    (should that fail, the old one is moved back), then the old one deleted.

    Args:
        prefix: name prefix of the temporary directory (default ``.{target.name}.``), for a caller
            that sweeps up the leftovers of writes killed midway and must recognise them.
        aside: where an existing ``target`` waits during the swap (default ``.{target.name}.old``
            beside it), for a caller that restores one left there by a kill between the renames.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _new_dir(target.parent, f".{target.name}." if prefix is None else prefix)
    try:
        yield tmp
        for item in tmp.rglob("*"):
            _plain_file_mode(item)
        fsync_tree(tmp)
        if not target.exists():
            move_into_place(tmp, target)
            return
        # POSIX cannot rename a directory over a non-empty one, so the old one moves aside first.
        old = target.with_name(f".{target.name}.old") if aside is None else Path(aside)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(target, old)
        try:
            move_into_place(tmp, target)
        except BaseException:
            os.rename(old, target)
            raise
        shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_dir(path: str | os.PathLike, trash_prefix: str = ".trash-") -> None:
    """Delete the directory ``path`` so that a crash midway never leaves half of it under its name.

    It is renamed (durably) to a hidden ``{trash_prefix}{name}-{random}`` sibling first, then
    deleted; a caller that sweeps up such leftovers gives a ``trash_prefix`` it recognises.
    """
    path = Path(path)
    trash = path.parent / f"{trash_prefix}{path.name}-{uuid.uuid4().hex[:8]}"
    os.rename(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) against other processes: a cache that
    several processes fill (the Taskflow export cache, under ``sampan serve --workers N``) is filled
    once, and none sees another's half-done swap. POSIX ``flock``; where there is none (Windows)
    the writes stay atomic but two processes may both fill the cache."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

"""Durable file primitives: write + flush + fsync, hashing, strict JSON, safe names.

The files written here go into a temporary directory that ``sampan.utils.atomic.atomic_dir``
renames into place; the renames and directory fsyncs themselves live there (DESIGN.md principle 6).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20
# Plain file names only: the manifest is read from disk, so a name like "../x" must not reach open().
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}")


def is_safe_name(name: object) -> bool:
    """True for a plain file name: letters, digits, ``_ . -``, not hidden, no path separators or ``..``."""
    return isinstance(name, str) and _SAFE_NAME.fullmatch(name) is not None and ".." not in name


def write_synced(path: Path, data: bytes) -> None:
    """Create ``path`` (it must not exist) holding ``data``, flushed and fsynced."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def sync_and_hash(path: Path) -> dict[str, Any]:
    """fsync a file written by someone else (safetensors) and return ``{"sha256", "bytes"}``."""
    with open(path, "r+b") as f:
        record = _hash_stream(f)
        os.fsync(f.fileno())
    return record


def hash_file(path: Path) -> dict[str, Any]:
    """``{"sha256": hex digest, "bytes": size}`` of a file, read in chunks."""
    with open(path, "rb") as f:
        return _hash_stream(f)


def _hash_stream(f: Any) -> dict[str, Any]:
    digest, size = hashlib.sha256(), 0
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return {"sha256": digest.hexdigest(), "bytes": size}


def json_bytes(obj: Any) -> bytes:
    """Strict JSON (NaN / Infinity are not JSON, and the codec never needs them), UTF-8, readable."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, indent=1).encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def load_json(path: Path) -> Any:
    """Parse a file as strict JSON; raises ``ValueError`` (incl. UnicodeDecodeError) when it is not."""
    return json.loads(path.read_bytes().decode("utf-8"), parse_constant=_reject_constant)

"""Content digests of files: the one place sampan hashes a file on disk."""

from __future__ import annotations

import hashlib
import os


def file_sha256(path: str | os.PathLike) -> str:
    """The hex SHA-256 of a file's bytes, read in 1 MiB blocks so large files stay out of memory.

    (``hashlib.file_digest`` does the same but needs Python 3.11; sampan supports 3.10.)
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

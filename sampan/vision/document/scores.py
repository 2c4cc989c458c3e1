"""A page's Markdown scored against the structure it was rendered from (pages.jsonl's ``structure``,
written by ``sampan data build-layout``).

- **Character accuracy**: ``1 - edits / reference characters``, edits the Levenshtein distance between
  the page's text as the Markdown has it (markup removed: :func:`markdown_text`) and the page's
  true text in reading order (:func:`truth_text`), both NFKC-folded with all whitespace dropped (as
  benchmarks/ocr.py scores pages). Reading-order mistakes cost edits too: a block read in the wrong
  place is deleted where it belongs and inserted where it was put. Below 0 when the Markdown holds
  more wrong text than the page has. Left out on both sides: headers and footers (furniture, see
  ``markdown``), figures (no text) and equations (the truth is the formula's mathtext source, which
  OCR of the typeset glyphs cannot give back; equations are counted instead).
- **Headings**: each true title (document title and section titles) is recovered when a Markdown
  heading's text is within 20% edits of it (one to one, best first); its level is right when the
  document title is ``#`` and a section title ``##`` or deeper.
- **Tables**: each true table is paired with the Markdown table whose text is closest; its shape is
  recovered when the rows (header row included) and the columns both match.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from sampan.vision.rec_metrics import edit_distance

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_EQUATION = re.compile(r"\$\$.*?\$\$", re.DOTALL)
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_SEPARATOR = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_LIST = re.compile(r"^(?:[-*+]|\d{1,3}\.)\s+")
_PIPE = re.compile(r"(?<!\\)\|")
_SKIPPED = ("header", "footer", "figure", "equation")


def fold(text: str) -> str:
    """NFKC (full- and half-width forms alike), all whitespace dropped: what the scores compare."""
    return "".join(unicodedata.normalize("NFKC", text).split())


def _table_rows(lines: list[str]) -> list[list[str]]:
    rows = []
    for line in lines:
        if _SEPARATOR.match(line):
            continue
        cells = _PIPE.split(line.strip())[1:-1]
        rows.append([c.strip().replace("\\|", "|") for c in cells])
    return rows


def _parse(markdown: str) -> tuple[list[str], list[tuple[int, str]], list[list[list[str]]], int]:
    """The Markdown's plain-text lines, headings ``(level, text)``, tables (cell rows) and equations."""
    markdown = _COMMENT.sub("", markdown)
    equations = len(_EQUATION.findall(markdown))
    markdown = _IMAGE.sub("", _EQUATION.sub("", markdown))
    text, headings, tables = [], [], []
    table: list[str] = []
    for raw in [*markdown.splitlines(), ""]:
        line = raw.strip()
        if line.startswith("|") and line.endswith("|") and len(line) > 1:
            table.append(line)
            continue
        if table:
            rows = _table_rows(table)
            tables.append(rows)
            text.extend("".join(r) for r in rows)
            table = []
        heading = _HEADING.match(line)
        if heading:
            headings.append((len(heading.group(1)), heading.group(2)))
            text.append(heading.group(2))
            continue
        line = _LIST.sub("", line, count=1)
        if len(line) > 1 and line.startswith("*") and line.endswith("*"):
            line = line[1:-1]
        text.append(line)
    return text, headings, tables, equations


def markdown_text(markdown: str) -> str:
    """The page's text as ``markdown`` has it, folded (:func:`fold`): comments, equations, images,
    heading marks, list markers, italics and table pipes removed."""
    return fold("".join(_parse(markdown)[0]))


def _structure(truth: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    structure = truth.get("structure") if isinstance(truth, dict) else truth
    if not isinstance(structure, list):
        raise ValueError("truth must be a pages.jsonl record (with 'structure', from `sampan data build-layout`) "
                         "or its structure list")
    return structure


def truth_text(truth: dict[str, Any] | list[dict[str, Any]]) -> str:
    """The page's true text in reading order, folded: every block but headers, footers, figures and
    equations; a table's cells row by row."""
    parts = []
    for block in _structure(truth):
        if block["class"] in _SKIPPED:
            continue
        if block.get("cells") is not None:
            parts.extend("".join(row) for row in block["cells"])
        else:
            parts.append(block["text"])
    return fold("".join(parts))


def _similarity(a: str, b: str) -> float:
    a, b = fold(a), fold(b)
    return 1.0 - edit_distance(a, b) / max(len(a), len(b), 1)


def document_scores(markdown: str, truth: dict[str, Any] | list[dict[str, Any]]) -> dict[str, Any]:
    """Scores of one page's ``markdown`` against ``truth`` (its pages.jsonl record or ``structure``).

    Returns ``{"char_accuracy", "edits", "reference_characters", "headings": {"expected",
    "found", "recovered", "levels_correct"}, "tables": {"expected", "found", "shape_recovered",
    "each": [{"rows", "cols", "found_rows", "found_cols"}]}, "equations": {"expected", "found"}}``.
    Sum ``edits`` and ``reference_characters`` over pages for a set's accuracy."""
    structure = _structure(truth)
    _, headings, tables, equations = _parse(markdown)
    predicted, reference = markdown_text(markdown), truth_text(structure)
    edits = edit_distance(predicted, reference)

    titles = [b for b in structure if b["class"] == "title"]
    pairs = sorted(((_similarity(t["text"], h[1]), i, j) for i, t in enumerate(titles) for j, h in enumerate(headings)),
                   reverse=True)
    used_t, used_h, recovered, levels = set(), set(), 0, 0
    for sim, i, j in pairs:
        if sim < 0.8 or i in used_t or j in used_h:
            continue
        used_t.add(i)
        used_h.add(j)
        recovered += 1
        levels += (titles[i].get("level", 2) == 1) == (headings[j][0] == 1)

    true_tables = [b for b in structure if b.get("cells") is not None]
    each, taken = [], set()
    for t in true_tables:
        text = "".join("".join(r) for r in t["cells"])
        options = [(_similarity(text, "".join("".join(r) for r in p)), k) for k, p in enumerate(tables) if k not in taken]
        entry = {"rows": t["rows"], "cols": t["cols"], "found_rows": 0, "found_cols": 0}
        if options:
            sim, k = max(options)
            if sim > 0:
                taken.add(k)
                entry |= {"found_rows": len(tables[k]), "found_cols": max(len(r) for r in tables[k])}
        each.append(entry)
    return {
        "char_accuracy": 1.0 - edits / max(len(reference), 1),
        "edits": edits,
        "reference_characters": len(reference),
        "headings": {"expected": len(titles), "found": len(headings), "recovered": recovered, "levels_correct": levels},
        "tables": {"expected": len(true_tables), "found": len(tables),
                   "shape_recovered": sum(e["rows"] == e["found_rows"] and e["cols"] == e["found_cols"] for e in each),
                   "each": each},
        "equations": {"expected": sum(b["class"] == "equation" for b in structure), "found": equations},
    }

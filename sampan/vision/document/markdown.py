"""A page's layout regions and OCR lines -> Markdown in reading order.

::

    regions = Taskflow("layout")(page)   # [{"label", "score", "box": [x0, y0, x1, y1]}]
    lines = Taskflow("ocr")(page)        # [{"text", "score", "box": 4 [x, y] points}]
    markdown = page_to_markdown(regions, lines, width, height)

The steps:

1. **Regions** are checked (CDLA's ten labels, ``sampan.vision.layout.classes``) and overlapping
   boxes of different labels are thinned (a detector may call one paragraph both text and title):
   the higher score keeps it.
2. **Lines** go to the region that holds most of their area (at least ``min_line_overlap``); lines
   outside every region are grouped into paragraphs of their own (vertically adjacent lines that
   overlap horizontally), so no text is lost when the layout model misses a block.
3. **Reading order** (:func:`reading_order`): headers first, footers last; the body is one or two
   columns. Two columns are found from the x-extents of the body's narrow regions (under 55% of
   the text width): a gutter near the middle that they do not cover, with a real share of them on
   each side. Then regions that cross the gutter (a title, an abstract across both columns) cut
   the page into bands, and each band is read left column, then right column, top to bottom.
4. **A region's text**: its lines grouped into rows by their vertical centres, rows top to bottom,
   lines in a row left to right, joined without spaces (Chinese) except one space between two
   Latin letters or digits.
5. **Rendering**: title -> ``#`` when its lines are at least ``doc_title_ratio`` times the page's
   body line height (the document title is set ~1.8-2.3x the body in the layouts seen here, section
   titles 1.1-1.6x), else ``##``; text -> a paragraph (a leading ``•`` or ``N.`` becomes a Markdown
   list item); table -> a Markdown table (line boxes clustered into rows by y and columns by x; the
   first row is the header); figure -> ``![figure](#)`` with its caption as an italic line after
   it; a table's caption -> an italic line before it; equation -> ``$$ OCR text $$``; reference ->
   a list item; header / footer -> HTML comments (``furniture="comment"``, the default) or
   dropped (``"drop"``). They are kept as comments because a running header and a page number are
   not part of the document's text (pages joined into one document would repeat them between
   paragraphs) but are worth keeping to a reader (the page number, the journal); a comment keeps
   them without rendering them.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from typing import Any, Literal

import numpy as np

from sampan.vision.layout.classes import CLASSES

_LATIN = re.compile(r"[A-Za-z0-9]")
_BULLET = re.compile(r"^\s*[•·●▪◦‣■□◆◇]\s*")
# "N." as the pages print a numbered item ("N、" and "N)" start ordinary sentences as often as lists).
_NUMBERED = re.compile(r"^\s*(\d{1,2})[.．](?!\d)\s*")


@dataclasses.dataclass
class MarkdownConfig:
    """How :func:`page_to_markdown` reads a page.

    Fields:
        min_line_overlap: the share of an OCR line's area a region must hold for the line to belong to
            it (less, and the line joins the paragraphs found outside every region).
        region_iou: two regions of different labels overlapping more than this are one block read twice;
            the lower-scored one is dropped.
        min_region_score: regions scored below this are ignored.
        doc_title_ratio: a title whose lines are this many times the body's line height or more is a
            ``#`` heading, a smaller one ``##``.
        furniture: what becomes of headers and footers: ``"comment"`` (HTML comments) or ``"drop"``.
    """

    min_line_overlap: float = 0.5
    region_iou: float = 0.6
    min_region_score: float = 0.0
    doc_title_ratio: float = 1.7
    furniture: Literal["comment", "drop"] = "comment"

    def __post_init__(self) -> None:
        if not 0.0 < self.min_line_overlap <= 1.0:
            raise ValueError(f"min_line_overlap is a share in (0, 1], got {self.min_line_overlap}")
        if not 0.0 < self.region_iou <= 1.0:
            raise ValueError(f"region_iou must be in (0, 1], got {self.region_iou}")
        if self.doc_title_ratio <= 1.0:
            raise ValueError(f"doc_title_ratio must be > 1 (a ratio to the body's line height), got {self.doc_title_ratio}")
        if self.furniture not in ("comment", "drop"):
            raise ValueError(f"furniture must be 'comment' or 'drop', got {self.furniture!r}")


@dataclasses.dataclass
class _Line:
    text: str
    box: tuple[float, float, float, float]

    @property
    def height(self) -> float:
        return self.box[3] - self.box[1]

    @property
    def cy(self) -> float:
        return (self.box[1] + self.box[3]) / 2


@dataclasses.dataclass
class _Region:
    label: str
    box: tuple[float, float, float, float]
    score: float
    lines: list[_Line] = dataclasses.field(default_factory=list)


def _area(b) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])


def _intersection(a, b) -> float:
    return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))


def _iou(a, b) -> float:
    inter = _intersection(a, b)
    return inter / max(_area(a) + _area(b) - inter, 1e-9)


def _line(item: dict[str, Any], index: int) -> _Line:
    try:
        box = np.asarray(item["box"], dtype=np.float64)
        text = str(item["text"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"OCR line {index} must be {{'text', 'box'}} with box 4 [x, y] points or [x0, y0, x1, y1] "
                         f"(what Taskflow('ocr') returns), got {item!r}") from exc
    if box.shape == (4, 2):
        x0, y0 = box.min(0)
        x1, y1 = box.max(0)
    elif box.shape == (4,):
        x0, y0, x1, y1 = box
    else:
        raise ValueError(f"OCR line {index}: box must be 4 [x, y] points or [x0, y0, x1, y1], got shape {box.shape}")
    return _Line(text.strip(), (float(x0), float(y0), float(x1), float(y1)))


def _regions(regions: list[dict[str, Any]], config: MarkdownConfig) -> list[_Region]:
    out = []
    for i, r in enumerate(regions):
        try:
            label, box = r["label"], [float(v) for v in r["box"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"region {i} must be {{'label', 'box': [x0, y0, x1, y1]}} (what Taskflow('layout') "
                             f"returns), got {r!r}") from exc
        if label not in CLASSES:
            raise ValueError(f"region {i} has label {label!r}; the layout labels are {', '.join(CLASSES)}")
        if len(box) != 4 or box[2] <= box[0] or box[3] <= box[1]:
            raise ValueError(f"region {i}: box must be [x0, y0, x1, y1] with x1 > x0 and y1 > y0, got {box}")
        score = float(r.get("score", 1.0))
        if score >= config.min_region_score:
            out.append(_Region(label, tuple(box), score))
    # Cross-label suppression: one block detected as two classes is read once, as the likelier one.
    kept: list[_Region] = []
    for r in sorted(out, key=lambda r: -r.score):
        if all(k.label == r.label or _iou(k.box, r.box) <= config.region_iou for k in kept):
            kept.append(r)
    return kept


def _assign(lines: list[_Line], regions: list[_Region], config: MarkdownConfig) -> list[_Line]:
    """Put each line into the region holding most of it; returns the lines no region holds."""
    orphans = []
    for line in lines:
        area = max(_area(line.box), 1e-9)
        best, share = None, 0.0
        for r in regions:
            s = _intersection(line.box, r.box) / area
            if s > share:
                best, share = r, s
        if best is not None and share >= config.min_line_overlap:
            best.lines.append(line)
        else:
            orphans.append(line)
    return orphans


def _orphan_paragraphs(orphans: list[_Line]) -> list[_Region]:
    """Lines outside every region, grouped into text regions: a line joins the group whose last line
    is just above it (gap under its height) and overlaps it horizontally."""
    groups: list[_Region] = []
    for line in sorted(orphans, key=lambda ln: (ln.box[1], ln.box[0])):
        for g in groups:
            last = g.lines[-1]
            overlap = min(last.box[2], line.box[2]) - max(last.box[0], line.box[0])
            if overlap > 0 and 0 <= line.box[1] - last.box[3] + 0.5 * last.height < 1.5 * last.height:
                g.lines.append(line)
                g.box = (min(g.box[0], line.box[0]), g.box[1], max(g.box[2], line.box[2]), max(g.box[3], line.box[3]))
                break
        else:
            groups.append(_Region("text", line.box, 0.0, [line]))
    return groups


def _column_split(boxes: list[tuple[float, float, float, float]]) -> tuple[float, float] | None:
    """``(x, tolerance)`` of the gutter of a two-column body, or None for one column."""
    if len(boxes) < 2:
        return None
    left, right = min(b[0] for b in boxes), max(b[2] for b in boxes)
    width = right - left
    if width < 50:
        return None
    narrow = [b for b in boxes if b[2] - b[0] < 0.55 * width]
    if len(narrow) < 2:
        return None
    # How much region height covers each x: a gutter is a dip the columns' boxes leave uncovered. Each
    # box is narrowed first: on a skewed scan a column's edge drifts by tens of pixels down the page
    # (2 degrees over 1,000 pixels is 35) and the two columns' x-extents overlap at the gutter.
    tol = 0.03 * width
    cover = np.zeros(int(np.ceil(width)) + 1)
    for b in narrow:
        cover[int(b[0] - left + tol):max(0, int(np.ceil(b[2] - left - tol)))] += b[3] - b[1]
    lo, hi = int(0.4 * width), int(0.6 * width)
    window = cover[lo:hi]
    low = window.min()
    start = int(np.argmin(window))
    end = start
    while end + 1 < len(window) and window[end + 1] == low:
        end += 1
    split = left + lo + (start + end) / 2
    left_mass = sum(b[3] - b[1] for b in narrow if b[2] <= split + tol)
    right_mass = sum(b[3] - b[1] for b in narrow if b[0] >= split - tol)
    total = sum(b[3] - b[1] for b in narrow)
    if min(left_mass, right_mass) < 0.2 * total or low > 0.1 * min(left_mass, right_mass):
        return None
    return float(split), float(tol)


def reading_order(boxes: list[tuple[float, float, float, float]] | list[list[float]], labels: list[str]) -> list[int]:
    """Indices of the regions ``boxes`` (x0, y0, x1, y1) with ``labels`` in reading order: headers
    (top to bottom, left to right), the body in one or two columns (see the module's docstring),
    footers."""
    boxes = [tuple(float(v) for v in b) for b in boxes]
    index = range(len(boxes))
    by_position = lambda i: (boxes[i][1], boxes[i][0])  # noqa: E731
    header = sorted((i for i in index if labels[i] == "header"), key=by_position)
    footer = sorted((i for i in index if labels[i] == "footer"), key=by_position)
    body = [i for i in index if labels[i] not in ("header", "footer")]
    found = _column_split([boxes[i] for i in body])
    if found is None:
        return header + sorted(body, key=by_position) + footer
    split, tol = found
    centre = lambda i: (boxes[i][0] + boxes[i][2]) / 2  # noqa: E731
    order: list[int] = []
    band: list[int] = []

    def flush() -> None:
        order.extend(sorted((i for i in band if centre(i) < split), key=by_position))
        order.extend(sorted((i for i in band if centre(i) >= split), key=by_position))
        band.clear()

    for i in sorted(body, key=by_position):
        x0, _, x1, _ = boxes[i]
        # Across the gutter (a title, an abstract, a table over both columns; a short line centred on
        # the page, a tenth of it or more on each side): it closes the band above it. A column's own
        # box may reach ``tol`` into the gutter (a skewed scan), which is no crossing.
        if (x0 < split - tol and x1 > split + tol) or (x0 < split < x1 and min(split - x0, x1 - split) > 0.1 * (x1 - x0)):
            flush()
            order.append(i)
        else:
            band.append(i)
    flush()
    return header + order + footer


def _rows(lines: list[_Line]) -> list[list[_Line]]:
    """Lines grouped into rows by vertical centre (top to bottom), each row left to right."""
    rows: list[list[_Line]] = []
    for line in sorted(lines, key=lambda ln: ln.cy):
        if rows:
            row = rows[-1]
            centre = statistics.fmean(ln.cy for ln in row)
            if abs(line.cy - centre) <= 0.5 * min(line.height, min(ln.height for ln in row)):
                row.append(line)
                continue
        rows.append([line])
    return [sorted(r, key=lambda ln: ln.box[0]) for r in rows]


def join_text(pieces: list[str]) -> str:
    """Pieces of text joined as a reader would: nothing between Chinese characters, one space between
    two Latin letters or digits (words split over lines or boxes)."""
    out = ""
    for piece in pieces:
        piece = piece.strip()
        if not piece:
            continue
        if out and _LATIN.match(out[-1]) and _LATIN.match(piece[0]):
            out += " "
        out += piece
    return out


def _region_text(region: _Region) -> str:
    return join_text([line.text for row in _rows(region.lines) for line in row])


def _intervals(spans: list[tuple[float, float]], tolerance: float) -> list[list[float]]:
    merged: list[list[float]] = []
    for x0, x1 in sorted(spans):
        if merged and x0 <= merged[-1][1] + tolerance:
            merged[-1][1] = max(merged[-1][1], x1)
        else:
            merged.append([x0, x1])
    return merged


def table_cells(lines: list[dict[str, Any]]) -> list[list[str]]:
    """A table's cell texts, row by row, from its OCR lines (``[{"text", "box"}]`` as Taskflow("ocr")
    gives them): rows by vertical centre, columns where the lines' x-extents, merged over all rows,
    leave gaps (see :func:`_table_cells`)."""
    return _table_cells([_line(item, i) for i, item in enumerate(lines)])


def _table_cells(lines: list[_Line]) -> list[list[str]]:
    """A table's cell texts, row by row, from its line boxes: rows by vertical centre, columns
    where the lines' x-extents, merged over all rows, leave gaps. When one line bridges two columns
    (OCR read two cells as one), there are fewer gaps than the fullest row has lines; then the
    fullest rows' own boxes set the columns."""
    rows = _rows(lines)
    if not rows:
        return []
    height = statistics.median(ln.height for ln in lines)
    columns = _intervals([(ln.box[0], ln.box[2]) for ln in lines], 0.3 * height)
    widest = max(len(r) for r in rows)
    if len(columns) < widest:
        full = [r for r in rows if len(r) == widest]
        columns = [[statistics.median(r[k].box[0] for r in full), statistics.median(r[k].box[2] for r in full)]
                   for k in range(widest)]
    cells = []
    for row in rows:
        texts: list[list[str]] = [[] for _ in columns]
        for line in row:
            overlaps = [min(line.box[2], c[1]) - max(line.box[0], c[0]) for c in columns]
            if max(overlaps) > 0:
                k = int(np.argmax(overlaps))
            else:  # between columns: the nearest by centre
                cx = (line.box[0] + line.box[2]) / 2
                k = int(np.argmin([abs(cx - (c[0] + c[1]) / 2) for c in columns]))
            texts[k].append(line.text)
        cells.append([join_text(t) for t in texts])
    return cells


def _markdown_table(cells: list[list[str]]) -> str:
    esc = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(c) for c in cells[0]) + " |", "|" + " --- |" * len(cells[0])]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in cells[1:]]
    return "\n".join(lines)


def _list_item(text: str) -> str | None:
    """``text`` as a Markdown list item when it starts with a bullet or ``N.``, else None."""
    m = _BULLET.match(text)
    if m:
        return "- " + text[m.end():]
    m = _NUMBERED.match(text)
    if m and m.end() < len(text):
        return f"{m.group(1)}. " + text[m.end():]
    return None


def _comment(kind: str, text: str) -> str:
    return f"<!-- {kind}: {text.replace('--', '- -')} -->"


def _pair_captions(order: list[_Region]) -> dict[int, int]:
    """Caption -> the figure (or table) it belongs to, by ``id``: the nearest one it overlaps
    horizontally; each figure or table takes its nearest caption only."""
    best: dict[int, tuple[float, int]] = {}
    for cap in order:
        target = {"figure_caption": "figure", "table_caption": "table"}.get(cap.label)
        if target is None:
            continue
        for t in order:
            if t.label != target or min(cap.box[2], t.box[2]) <= max(cap.box[0], t.box[0]):
                continue
            gap = max(t.box[1] - cap.box[3], cap.box[1] - t.box[3], 0.0)
            if gap < 3 * max(cap.box[3] - cap.box[1], 1.0) and gap < best.get(id(t), (float("inf"), 0))[0]:
                best[id(t)] = (gap, id(cap))
    return {cap: target for target, (_, cap) in best.items()}


def page_to_markdown(regions: list[dict[str, Any]], lines: list[dict[str, Any]], width: float, height: float,
                     config: MarkdownConfig | None = None) -> str:
    """Markdown of one page from its layout ``regions`` (``[{"label", "score", "box": [x0, y0, x1,
    y1]}]``, CDLA's labels) and OCR ``lines`` (``[{"text", "score", "box": 4 [x, y] points}]``),
    both in the page's pixels (``width`` x ``height``). See the module's docstring for the rules."""
    config = config or MarkdownConfig()
    if width <= 0 or height <= 0:
        raise ValueError(f"page size must be positive, got {width} x {height}")
    found = _regions(regions, config)
    orphans = _assign([_line(item, i) for i, item in enumerate(lines)], found, config)
    found += _orphan_paragraphs(orphans)
    order = [found[i] for i in reading_order([r.box for r in found], [r.label for r in found])]

    text_heights = [ln.height for r in found if r.label == "text" for ln in r.lines]
    all_heights = [ln.height for r in found for ln in r.lines]
    body = statistics.median(text_heights or all_heights) if (text_heights or all_heights) else 0.0

    captions = _pair_captions(order)
    caption_of = {target: next(c for c in order if id(c) == cap) for cap, target in captions.items()}
    blocks: list[tuple[str, str]] = []  # (kind, markdown); kind "item" joins its neighbours without a blank line

    def render(r: _Region) -> None:
        text = _region_text(r)
        if r.label in ("header", "footer"):
            if config.furniture == "comment" and text:
                blocks.append(("block", _comment(r.label, text)))
        elif r.label == "title":
            if text:
                ratio = statistics.median(ln.height for ln in r.lines) / body if body else 1.0
                blocks.append(("block", ("# " if ratio >= config.doc_title_ratio else "## ") + text))
        elif r.label == "text":
            if text:
                item = _list_item(text)
                blocks.append(("item", item) if item is not None else ("block", text))
        elif r.label == "reference":
            if text:
                blocks.append(("item", "- " + text))
        elif r.label == "table":
            cells = _table_cells(r.lines)
            blocks.append(("block", _markdown_table(cells) if cells else "<!-- table: no text read -->"))
        elif r.label == "figure":
            blocks.append(("block", "![figure](#)"))  # its lines (chart labels) are not the document's text
        elif r.label in ("figure_caption", "table_caption"):
            if text:
                blocks.append(("block", f"*{text}*"))
        elif r.label == "equation":
            blocks.append(("block", f"$$ {text} $$" if text else "$$ $$"))

    for r in order:
        if id(r) in captions:
            continue  # written beside its figure or table
        cap = caption_of.get(id(r))
        if cap is not None and r.label == "table":
            render(cap)
        render(r)
        if cap is not None and r.label == "figure":
            render(cap)
    out: list[str] = []
    for k, (kind, text) in enumerate(blocks):
        if out:
            out.append("\n" if kind == "item" and blocks[k - 1][0] == "item" else "\n\n")
        out.append(text)
    return "".join(out) + "\n" if out else ""

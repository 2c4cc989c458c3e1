"""Page templates: layout recipes (columns, margins, sizes, what blocks a page is made of).

Some templates are held out: they are rendered only into the test split, never into train, so the
test split measures layouts a detector has not seen (as a held-out font measures an unseen typeface).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Template:
    """One layout recipe.

    Fields:
        name: the id recorded in pages.jsonl and the manifest.
        columns: body columns (1 or 2).
        margin: page margins in pixels (left/right, top/bottom).
        body_px: the body text's size range in pixels (low, high).
        title_scale: a section title's size relative to the body.
        doc_title: whether the page opens with a document title across all columns.
        weights: how often each block kind is drawn for the body (paragraph, list, table, figure,
            equation); references close the page when ``references`` fires.
        references: the chance the page ends with a 参考文献 list.
        header_align: where the running header sits (left, center, right, split).
        rule: whether a line separates the header from the body (papers and reports have one).
        held_out: rendered only into the test split.
    """

    name: str
    columns: int
    margin: tuple[int, int]
    body_px: tuple[int, int]
    title_scale: float
    doc_title: bool
    weights: dict[str, float]
    references: float
    header_align: str
    rule: bool
    held_out: bool = False


TEMPLATES: tuple[Template, ...] = (
    Template("paper-2col", 2, (56, 48), (12, 14), 1.25, True,
             {"paragraph": 5, "list": 0.5, "table": 1, "figure": 1, "equation": 1.2}, 0.5, "split", True),
    Template("report-1col", 1, (80, 64), (14, 17), 1.35, True,
             {"paragraph": 5, "list": 1.5, "table": 1.5, "figure": 1, "equation": 0.2}, 0.15, "right", True),
    Template("textbook-1col", 1, (96, 72), (15, 18), 1.4, False,
             {"paragraph": 4, "list": 1, "table": 0.7, "figure": 1, "equation": 1.5}, 0.1, "center", False),
    Template("news-2col", 2, (40, 40), (13, 15), 1.5, True,
             {"paragraph": 6, "list": 0.3, "table": 0.4, "figure": 1.2, "equation": 0}, 0.0, "left", True),
    # Held out: a magazine look (large titles, many figures) and a thesis page with wide margins.
    Template("magazine-2col", 2, (48, 56), (13, 16), 1.6, True,
             {"paragraph": 5, "list": 0.8, "table": 0.6, "figure": 1.5, "equation": 0.1}, 0.1, "center", False,
             held_out=True),
    Template("thesis-1col", 1, (110, 80), (14, 16), 1.3, False,
             {"paragraph": 4, "list": 0.6, "table": 1, "figure": 0.8, "equation": 1.0}, 0.4, "split", True,
             held_out=True),
)


def templates_for(split: str) -> list[Template]:
    """The templates a split draws from: train never sees a held-out one; test draws from all of
    them, and pages.jsonl says which were held out, so seen and unseen layouts can be scored apart."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return [t for t in TEMPLATES if split == "test" or not t.held_out]

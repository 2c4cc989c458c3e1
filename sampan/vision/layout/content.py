"""What a page says: its blocks in reading order, drawn from the corpora with a seeded generator.

A page is a running header, an optional document title (with authors and an abstract on papers), a
body of *units* (a paragraph; a list; a table with its caption; a figure with its caption; an
equation; a section title) laid into the template's columns, a 参考文献 list on some pages, and a
footer. A unit is laid out whole (never split across columns), so each block's box is one rectangle.
The body is drawn a little longer than the page holds; the browser drops the units that overflow.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sampan.vision.layout.assets import FORMULAS, chart_png, equation_png
from sampan.vision.layout.templates import Template
from sampan.vision.text_sources import TextSource, amount_text, date_text

JOURNALS = ("计算机学报", "中国科学：信息科学", "经济研究", "管理世界", "中文信息学报", "软件学报", "物理学报",
            "中国社会科学", "自动化学报", "地理学报", "历史研究", "文学评论", "数学学报", "电子学报")
SURNAMES = "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈"
GIVEN = "伟芳娜敏静丽强磊军洋勇艳杰娟涛明超秀霞平刚桂英华玉兰萍红建文辉力斌宇浩凯鹏飞云峰晨阳雪琳"
COLUMN_WORDS = ("项目", "指标", "数量", "金额", "比例", "年份", "地区", "类别", "单位", "增长率", "合计", "备注",
                "人数", "均值", "标准差", "样本", "得分", "排名", "产量", "收入", "支出", "占比")
SECTION_FORMS = ("{n} ", "{n}.{m} ", "{cn}、", "第{cn}章 ", "（{cn}）", "")
_CN = "一二三四五六七八九十"
_END_PUNCT = "，。！？；：、”“（）《》 "


@dataclasses.dataclass
class Block:
    """One layout element: what the detector must find and what document-to-Markdown must recover.

    Fields:
        id: the block's number on its page (its ``data-bid`` in the HTML).
        cls: its layout class (one of ``classes.CLASSES``).
        kind: what it is in the page's structure: doc_title, section_title, paragraph, list_item,
            table, table_caption, figure, figure_caption, equation, header, footer, reference, authors.
        text: its text ("" for a figure; the mathtext source for an equation).
        level: a title's level (1 the document title, 2 a section, 3 a subsection); 0 otherwise.
        cells: a table's cell texts, row by row, the header row first.
        image: a figure's or equation's PNG bytes (embedded as a data URI).
        ordered: a list item's list is numbered.
        extra: anything else the record keeps (a chart's kind, an image's size in pixels).
    """

    id: int
    cls: str
    kind: str
    text: str = ""
    level: int = 0
    cells: list[list[str]] | None = None
    image: bytes | None = None
    ordered: bool = False
    extra: dict = dataclasses.field(default_factory=dict)

    def record(self) -> dict:
        """The block's entry in pages.jsonl's structure (no image bytes)."""
        out: dict = {"id": self.id, "class": self.cls, "kind": self.kind, "text": self.text}
        if self.level:
            out["level"] = self.level
        if self.kind == "list_item":
            out["ordered"] = self.ordered  # the page shows "N." or "•" before the text; ``text`` leaves it out
        if self.cells is not None:
            out |= {"rows": len(self.cells), "cols": len(self.cells[0]), "cells": self.cells}
        return out | self.extra


@dataclasses.dataclass
class PageContent:
    """A page's blocks, grouped as the HTML lays them out.

    Fields:
        header: the running header's blocks (one, or two when split left / right).
        front: the blocks across all columns before the body (document title, authors, abstract).
        units: the body, each unit a list of blocks laid out together.
        footer: the footer's block.
        body_px: the body text's size in pixels.
        content_width: the page's text width in pixels (all columns).
    """

    header: list[Block]
    front: list[Block]
    units: list[list[Block]]
    footer: list[Block]
    body_px: int
    content_width: int


class _Ids:
    def __init__(self) -> None:
        self.next = 0

    def __call__(self) -> int:
        self.next += 1
        return self.next - 1


def _clean(text: str, allowed: frozenset[str]) -> str:
    return "".join(c for c in text if c in allowed)


def _phrase(source: TextSource, rng: np.random.Generator, low: int, high: int, allowed: frozenset[str]) -> str:
    """A short run of corpus text without punctuation at its ends (for titles and captions)."""
    text = source.passage(rng, int(rng.integers(low, high + 1)), allowed).text
    return text.strip(_END_PUNCT).replace("\n", "") or "概述"


def _name(rng: np.random.Generator) -> str:
    given = "".join(GIVEN[int(i)] for i in rng.integers(len(GIVEN), size=int(rng.integers(1, 3))))
    return SURNAMES[int(rng.integers(len(SURNAMES)))] + given


def _cell(rng: np.random.Generator, allowed: frozenset[str]) -> str:
    form = rng.random()
    if form < 0.35:
        return f"{rng.uniform(0, 1000):.{int(rng.integers(0, 3))}f}"
    if form < 0.55:
        return f"{rng.uniform(0, 100):.1f}%"
    if form < 0.7:
        return f"{int(rng.integers(1, 100000)):,}"
    if form < 0.8:
        return _clean(amount_text(rng), allowed)
    if form < 0.9:
        return _clean(date_text(rng), allowed)
    return str(int(rng.integers(1990, 2030)))


class ContentDrawer:
    """Draws the content of pages of one split.

    Args:
        source: the split's text source (its corpora's documents of that split).
    """

    def __init__(self, source: TextSource) -> None:
        self.source = source

    def page(self, rng: np.random.Generator, template: Template, allowed: frozenset[str],
             size: tuple[int, int], font_path: str | None = None) -> PageContent:
        """A page's content for ``template``, its text limited to the font's characters ``allowed``;
        charts label in Chinese with ``font_path`` (the page's font file)."""
        ids = _Ids()
        body_px = int(rng.integers(template.body_px[0], template.body_px[1] + 1))
        width, height = size
        content_width = width - 2 * template.margin[0]
        column_width = (content_width - 24 * (template.columns - 1)) / template.columns
        header = self._header(rng, template, ids, allowed)
        front = self._front(rng, template, ids, allowed) if template.doc_title else []
        # How much body the page holds: its columns' area, less the front matter's estimate.
        capacity = template.columns * (height - 2 * template.margin[1] - 4 * body_px * 1.7)
        capacity -= sum(self._estimate([b], content_width, body_px) for b in front)
        refs = self._references(rng, ids, allowed) if rng.random() < template.references else []
        budget = 1.15 * capacity - sum(self._estimate(u, column_width, body_px) for u in refs)
        units: list[list[Block]] = []
        counters = {"section": 0, "table": 0, "figure": 0}
        kinds = list(template.weights)
        p = np.array([template.weights[k] for k in kinds], dtype=np.float64)
        p /= p.sum()
        used = 0.0
        while used < budget:
            if not units or rng.random() < 0.12:
                counters["section"] += 1
                unit = [self._section_title(rng, counters["section"], ids, allowed)]
            else:
                kind = kinds[int(rng.choice(len(kinds), p=p))]
                unit = self._unit(kind, rng, ids, allowed, column_width, body_px, counters, font_path)
            used += self._estimate(unit, column_width, body_px)
            units.append(unit)
        units += refs
        footer = [Block(ids(), "footer", "footer", self._footer_text(rng, allowed))]
        return PageContent(header, front, units, footer, body_px, content_width)

    # -- front matter, header and footer ------------------------------------------------------------
    def _header(self, rng, template, ids, allowed) -> list[Block]:
        journal = JOURNALS[int(rng.integers(len(JOURNALS)))]
        year = int(rng.integers(1995, 2026))
        issue = f"{year}年 第{int(rng.integers(1, 60))}卷 第{int(rng.integers(1, 13))}期"
        if template.header_align == "split":
            return [Block(ids(), "header", "header", _clean(journal, allowed)),
                    Block(ids(), "header", "header", _clean(issue, allowed))]
        text = f"{journal}  {issue}" if rng.random() < 0.6 else _phrase(self.source, rng, 6, 16, allowed)
        return [Block(ids(), "header", "header", _clean(text, allowed))]

    def _footer_text(self, rng, allowed) -> str:
        n = int(rng.integers(1, 300))
        forms = [f"— {n} —", f"第 {n} 页", str(n), f"第 {n} 页 共 {n + int(rng.integers(1, 40))} 页", f"· {n} ·"]
        return _clean(forms[int(rng.integers(len(forms)))], allowed) or str(n)

    def _front(self, rng, template, ids, allowed) -> list[Block]:
        blocks = [Block(ids(), "title", "doc_title", _phrase(self.source, rng, 8, 22, allowed), level=1)]
        if template.name.startswith(("paper", "thesis")) or rng.random() < 0.3:
            names = "，".join(_name(rng) for _ in range(int(rng.integers(1, 5))))
            blocks.append(Block(ids(), "text", "authors", _clean(names, allowed)))
        if template.name.startswith("paper") or rng.random() < 0.3:
            abstract = self.source.passage(rng, int(rng.integers(80, 180)), allowed).text.replace("\n", "")
            blocks.append(Block(ids(), "text", "paragraph", _clean("摘要：", allowed) + abstract))
        return blocks

    # -- body units ---------------------------------------------------------------------------------
    def _section_title(self, rng, number, ids, allowed) -> Block:
        form = SECTION_FORMS[int(rng.integers(len(SECTION_FORMS)))]
        level = 3 if "{m}" in form else 2
        prefix = form.format(n=number, m=int(rng.integers(1, 5)), cn=_CN[(number - 1) % 10])
        return Block(ids(), "title", "section_title", _clean(prefix, allowed) + _phrase(self.source, rng, 4, 14, allowed),
                     level=level)

    def _unit(self, kind, rng, ids, allowed, column_width, body_px, counters, font_path) -> list[Block]:
        if kind == "paragraph":
            text = self.source.passage(rng, int(rng.integers(50, 240)), allowed).text.replace("\n", "")
            return [Block(ids(), "text", "paragraph", text)]
        if kind == "list":
            ordered = bool(rng.random() < 0.5)
            return [Block(ids(), "text", "list_item",
                          self.source.passage(rng, int(rng.integers(12, 60)), allowed).text.replace("\n", ""),
                          ordered=ordered) for _ in range(int(rng.integers(2, 6)))]
        if kind == "table":
            counters["table"] += 1
            rows, cols = int(rng.integers(3, 8)), int(rng.integers(2, 6))
            head = [COLUMN_WORDS[int(i)] for i in rng.choice(len(COLUMN_WORDS), size=cols, replace=False)]
            body = [[_phrase(self.source, rng, 2, 6, allowed)] + [_cell(rng, allowed) for _ in range(1, cols)]
                    for _ in range(rows - 1)]
            caption = Block(ids(), "table_caption", "table_caption",
                            f"表{counters['table']} " + _phrase(self.source, rng, 6, 18, allowed))
            return [caption, Block(ids(), "table", "table", cells=[[_clean(c, allowed) for c in head]] + body)]
        if kind == "figure":
            counters["figure"] += 1
            w = int(column_width * rng.uniform(0.55, 0.95))
            h = int(w * rng.uniform(0.5, 0.75))
            png, chart = chart_png(rng, w, h, font_path, allowed)
            figure = Block(ids(), "figure", "figure", image=png, extra={"chart": chart, "image_size": [w, h]})
            caption = Block(ids(), "figure_caption", "figure_caption",
                            f"图{counters['figure']} " + _phrase(self.source, rng, 6, 20, allowed))
            return [figure, caption]
        if kind == "equation":
            formula = FORMULAS[int(rng.integers(len(FORMULAS)))]
            return [Block(ids(), "equation", "equation", formula, image=equation_png(formula, int(body_px * 1.3)))]
        raise ValueError(f"unknown block kind {kind!r}")

    def _references(self, rng, ids, allowed) -> list[list[Block]]:
        title = Block(ids(), "title", "section_title", _clean("参考文献", allowed), level=2)
        entries = []
        for i in range(int(rng.integers(2, 7))):
            authors = ", ".join(_name(rng) for _ in range(int(rng.integers(1, 4))))
            year = int(rng.integers(1980, 2026))
            journal = JOURNALS[int(rng.integers(len(JOURNALS)))]
            text = (f"[{i + 1}] {authors}. {_phrase(self.source, rng, 8, 24, allowed)}[J]. {journal}, {year}, "
                    f"{int(rng.integers(1, 60))}({int(rng.integers(1, 13))}): {int(rng.integers(1, 200))}-"
                    f"{int(rng.integers(200, 400))}.")
            entries.append(Block(ids(), "reference", "reference", _clean(text, allowed)))
        return [[title]] + [[e] for e in entries]

    @staticmethod
    def _estimate(unit: list[Block], width: float, px: int) -> float:
        """A unit's height in pixels, roughly (only to draw about a page's worth of body)."""
        total = 0.0
        for b in unit:
            if b.cells is not None:
                total += (len(b.cells) + 1) * px * 2.0
            elif b.kind == "figure":
                total += b.extra["image_size"][1] + px
            elif b.kind == "equation":
                total += px * 3.5
            else:
                scale = 1.4 if b.cls == "title" else 1.0
                lines = math.ceil(len(b.text) * px * scale / max(width, 1.0))
                total += lines * px * scale * 1.7 + px * 0.8
        return total

"""A page's content as one self-contained HTML file (images as data URIs, the font by family name).

Every layout element carries ``data-cls`` (its class) and ``data-bid`` (its block id); elements whose
box should hug their text (paragraphs, titles, captions) carry ``data-tight="1"`` and are measured by
a DOM Range over their contents, the rest (tables, images) by their own border box. Body units are
``.unit`` children of ``#body``, a CSS multi-column box of the page's fixed height; a unit is never
split across columns (``break-inside: avoid``), so each element is one rectangle.
"""

from __future__ import annotations

import base64
import html as html_lib

import numpy as np

from sampan.vision.layout.content import Block, PageContent
from sampan.vision.layout.templates import Template

ALIGN = {"left": "flex-start", "center": "center", "right": "flex-end", "split": "space-between"}
COLUMN_GAP = 24


def _esc(text: str) -> str:
    return html_lib.escape(text, quote=True)


def _attrs(block: Block, tight: bool) -> str:
    return f'data-cls="{block.cls}" data-bid="{block.id}"' + (' data-tight="1"' if tight else "")


def _img(block: Block, width: int | None = None) -> str:
    src = "data:image/png;base64," + base64.b64encode(block.image or b"").decode("ascii")
    size = f' width="{width}"' if width else ""
    return f'<img {_attrs(block, False)} src="{src}"{size} alt="">'


def _block(block: Block, list_index: int) -> str:
    tight = _attrs(block, True)
    if block.kind == "doc_title":
        return f"<h1 {tight}>{_esc(block.text)}</h1>"
    if block.kind == "section_title":
        tag = "h2" if block.level <= 2 else "h3"
        return f"<{tag} {tight}>{_esc(block.text)}</{tag}>"
    if block.kind == "authors":
        return f'<div class="authors" {tight}>{_esc(block.text)}</div>'
    if block.kind == "paragraph":
        return f"<p {tight}>{_esc(block.text)}</p>"
    if block.kind == "list_item":
        # The marker is text, not a ::marker, so the item's tight box takes it in (as print shows it).
        marker = f"{list_index + 1}." if block.ordered else "•"
        return f'<div class="li" {tight}>{marker} {_esc(block.text)}</div>'
    if block.kind in ("table_caption", "figure_caption"):
        return f'<div class="cap" {tight}>{_esc(block.text)}</div>'
    if block.kind == "table":
        assert block.cells is not None
        head = "".join(f"<th>{_esc(c)}</th>" for c in block.cells[0])
        rows = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in block.cells[1:])
        return f'<table {_attrs(block, False)}><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'
    if block.kind == "figure":
        return f'<div class="fig">{_img(block, block.extra["image_size"][0])}</div>'
    if block.kind == "equation":
        return f'<div class="eq">{_img(block)}</div>'
    if block.kind == "reference":
        return f'<div class="ref" {tight}>{_esc(block.text)}</div>'
    if block.kind in ("header", "footer"):
        return f"<span {tight}>{_esc(block.text)}</span>"
    raise ValueError(f"no HTML for block kind {block.kind!r}")


def _unit(unit: list[Block]) -> str:
    items = [_block(b, i) for i, b in enumerate(unit)]
    # A reference list closes the page: the browser trims body units before it, never it.
    keep = " keep" if unit[0].kind == "reference" or unit[0].text == "参考文献" else ""
    return f'<div class="unit{keep}">' + "".join(items) + "</div>"


def page_html(content: PageContent, template: Template, family: str, size: tuple[int, int],
              rng: np.random.Generator) -> tuple[str, dict]:
    """The page's HTML and the style choices drawn for it (recorded in pages.jsonl)."""
    width, height = size
    mx, my = template.margin
    px = content.body_px
    style = {
        "line_height": round(float(rng.uniform(1.45, 1.85)), 2),
        "indent": bool(rng.random() < 0.75),
        "justify": bool(rng.random() < 0.7),
        "table_style": ["grid", "three-line", "striped"][int(rng.integers(3))],
        "title_align": "center" if template.doc_title and rng.random() < 0.8 else "left",
        "section_align": "left" if rng.random() < 0.8 else "center",
        "ink": ["#111", "#222", "#000", "#1a1a2e"][int(rng.integers(4))],
    }
    grid = "border:1px solid #444;" if style["table_style"] == "grid" else ""
    three = ("table{border-top:2px solid #222;border-bottom:2px solid #222}thead th{border-bottom:1px solid #222}"
             if style["table_style"] != "grid" else "")
    stripe = "tbody tr:nth-child(even){background:#eef1f5}" if style["table_style"] == "striped" else ""
    rule = "border-bottom:1px solid #333;" if template.rule else ""
    css = f"""
html,body{{margin:0;padding:0;background:#fff}}
body{{width:{width}px;height:{height}px;overflow:hidden;position:relative;font-family:"{family}";font-size:{px}px;
line-height:{style['line_height']};color:{style['ink']}}}
#header{{position:absolute;left:{mx}px;width:{width - 2 * mx}px;top:{int(my * 0.35)}px;display:flex;
justify-content:{ALIGN[template.header_align]};font-size:{max(10, px - 3)}px;padding-bottom:3px;{rule}}}
#footer{{position:absolute;left:{mx}px;width:{width - 2 * mx}px;bottom:{int(my * 0.35)}px;text-align:center;
font-size:{max(10, px - 3)}px}}
#main{{position:absolute;left:{mx}px;top:{my}px;width:{width - 2 * mx}px;height:{height - 2 * my}px;display:flex;
flex-direction:column}}
#front{{flex:0 0 auto;margin-bottom:{px}px}}
#body{{flex:1 1 auto;min-height:0;column-count:{template.columns};column-gap:{COLUMN_GAP}px;column-fill:auto}}
.unit{{break-inside:avoid;margin:0 0 {int(px * 0.6)}px 0}}
h1{{font-size:{round(px * template.title_scale * 1.45)}px;text-align:{style['title_align']};margin:0 0 {px // 2}px 0;
line-height:1.3}}
h2{{font-size:{round(px * template.title_scale)}px;text-align:{style['section_align']};margin:{px // 2}px 0 0 0;
line-height:1.35}}
h3{{font-size:{round(px * 1.1)}px;margin:{px // 3}px 0 0 0;line-height:1.35}}
p{{margin:0;text-indent:{'2em' if style['indent'] else '0'};text-align:{'justify' if style['justify'] else 'left'}}}
.authors{{text-align:center;margin-bottom:{px // 2}px}}
.li{{padding-left:1.2em;text-indent:-1.2em;margin:0 0 2px 0}}
.cap{{text-align:center;font-size:{max(10, px - 1)}px;margin:3px 0}}
table{{border-collapse:collapse;margin:0 auto;font-size:{max(10, px - 1)}px;{grid}}}
th,td{{padding:2px 8px;text-align:center;{grid}}}
{three}{stripe}
.fig,.eq{{text-align:center;line-height:0;margin:2px 0}}
.ref{{font-size:{max(10, px - 2)}px;padding-left:2em;text-indent:-2em}}
"""
    header = "".join(_block(b, 0) for b in content.header)
    front = "".join(_block(b, 0) for b in content.front)
    body = "".join(_unit(u) for u in content.units)
    footer = "".join(_block(b, 0) for b in content.footer)
    doc = (f'<!DOCTYPE html>\n<html lang="zh-CN"><head><meta charset="utf-8"><style>{css}</style></head>'
           f'<body><div id="header">{header}</div><div id="main"><div id="front">{front}</div>'
           f'<div id="body">{body}</div></div><div id="footer">{footer}</div></body></html>\n')
    return doc, style

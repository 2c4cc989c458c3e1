"""Rendering text with its ground truth: a line (image, text, one box per character, the line's
quadrilateral) and a page (paragraphs and headings in one or two columns, blocks turned by small
angles, one quadrilateral per line).

Text is drawn one character at a time at whole-pixel positions into a coverage mask, so each
character's box is the exact extent of the ink FreeType drew for it (``ink_box``) and the line's box
is their union: tight on the ink, as a detector's labels should be. The mask is then coloured onto a
background (flat, gradient or paper texture). Pillow's basic layout engine is forced:
raqm is present on some machines and not others, and the same seed must give the same pixels.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from sampan.vision import geometry
from sampan.vision.fonts import Font
from sampan.vision.text_sources import TextSource

RGB = tuple[int, int, int]


@lru_cache(maxsize=256)
def pil_font(path: str, index: int, size: int) -> ImageFont.FreeTypeFont:
    """The face at ``size`` pixels (cached: loading a CJK .ttc costs milliseconds)."""
    return ImageFont.truetype(path, size, index=index, layout_engine=ImageFont.Layout.BASIC)


@lru_cache(maxsize=65536)
def ink_box(font: ImageFont.FreeTypeFont, ch: str) -> tuple[int, int, int, int] | None:
    """The pixels ``ch`` inks when drawn at (0, 0), as ``x0, y0, x1, y1`` (None: no ink). Not
    ``getbbox``: that one reaches the advance on the right and the line's extent vertically, so
    "。" would get a full-width box."""
    bitmap, (dx, dy) = font.getmask2(ch, mode="L")
    try:
        box = bitmap.getbbox(False)  # Pillow >= 9.4 takes alpha_only
    except TypeError:
        box = bitmap.getbbox()
    return None if box is None else (dx + box[0], dy + box[1], dx + box[2], dy + box[3])


def draw_text(mask: Image.Image, xy: tuple[float, float], text: str, font: ImageFont.FreeTypeFont,
              spacing: float = 0.0) -> np.ndarray:
    """Draw ``text`` into the L-mode ``mask`` with its top-left (ascender line) at ``xy``, character by
    character, ``spacing`` pixels apart beyond the advance; returns the characters' boxes ``(n, 4)``
    as ``x0, y0, x1, y1``: the ink's extent, or for a space its advance cell at the line's height."""
    draw = ImageDraw.Draw(mask)
    x, y = float(xy[0]), int(round(xy[1]))
    boxes = np.zeros((len(text), 4), dtype=np.float64)
    blank = []
    for i, ch in enumerate(text):
        advance = font.getlength(ch)
        left = int(round(x))
        box = ink_box(font, ch) if ch.strip() else None
        if box is None:  # a space, or a glyph without ink: its advance cell
            blank.append((i, left, left + advance))
        else:
            draw.text((left, y), ch, fill=255, font=font)
            boxes[i] = (left + box[0], y + box[1], left + box[2], y + box[3])
        x += advance + spacing
    inked = [i for i in range(len(text)) if i not in {b[0] for b in blank}]
    top = boxes[inked, 1].min() if inked else y
    bottom = boxes[inked, 3].max() if inked else y + font.size
    for i, x0, x1 in blank:
        boxes[i] = (x0, top, x1, bottom)
    return boxes


def text_width(text: str, font: ImageFont.FreeTypeFont, spacing: float = 0.0) -> float:
    return sum(font.getlength(ch) for ch in text) + spacing * max(0, len(text) - 1)


def ink_quad(text: str, boxes: np.ndarray) -> np.ndarray:
    """The line's quadrilateral: the union of its inked characters' boxes (spaces excluded)."""
    inked = boxes[[i for i, ch in enumerate(text) if ch.strip()]]
    if not len(inked):
        raise ValueError(f"line {text!r} has no visible character")
    return geometry.box_to_quad((inked[:, 0].min(), inked[:, 1].min(), inked[:, 2].max(), inked[:, 3].max()))


# -- colours and backgrounds ------------------------------------------------------------------------
def _luminance(c) -> float:
    return 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]


def colours(rng: np.random.Generator) -> tuple[RGB, RGB, str]:
    """A (background, text) pair with a readable contrast: mostly dark ink on light paper, sometimes
    coloured ink, now and then light text on a dark ground. Also returns the background kind."""
    kind = ["flat", "gradient", "paper"][int(rng.choice(3, p=[0.35, 0.2, 0.45]))]
    if rng.random() < 0.1:  # inverted: light text on a dark ground
        bg = tuple(int(v) for v in rng.integers(0, 90, 3))
        fg = tuple(int(v) for v in rng.integers(180, 256, 3))
    else:
        bg = tuple(int(v) for v in rng.integers(185, 256, 3))
        ink = rng.random()
        if ink < 0.65:  # black-ish
            fg = tuple(int(v) for v in rng.integers(0, 60, 1).repeat(3) + rng.integers(0, 15, 3))
        else:  # blue, red, green or brown ink
            fg = tuple(int(v) for v in rng.integers(0, 140, 3))
    while abs(_luminance(bg) - _luminance(fg)) < 90:  # push the ink darker (or lighter) until readable
        fg = tuple(max(0, v - 30) for v in fg) if _luminance(bg) > 127 else tuple(min(255, v + 30) for v in fg)
    return bg, fg, kind


def background(size: tuple[int, int], colour: RGB, kind: str, rng: np.random.Generator) -> Image.Image:
    """A ``kind`` background ("flat", "gradient" or "paper": low-frequency blotches plus grain)."""
    w, h = size
    base = np.empty((h, w, 3), dtype=np.float32)
    base[:] = colour
    if kind == "gradient":
        angle = rng.uniform(0, 2 * np.pi)
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        ramp = (np.cos(angle) * xx / max(w, 1) + np.sin(angle) * yy / max(h, 1))
        shift = rng.uniform(-40, 40, 3).astype(np.float32)
        base += ramp[..., None] * shift
    elif kind == "paper":
        cells = rng.normal(0, 1, (max(2, h // 40 + 2), max(2, w // 40 + 2)))
        blotch = Image.fromarray(((cells - cells.min()) / (np.ptp(cells) + 1e-6) * 255).astype(np.uint8))
        blotch = np.asarray(blotch.resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32) / 255 - 0.5
        base += blotch[..., None] * rng.uniform(8, 30)
        base += rng.normal(0, rng.uniform(1, 5), (h, w, 1)).astype(np.float32)
    return Image.fromarray(np.clip(np.rint(base), 0, 255).astype(np.uint8), "RGB")


def paint(image: Image.Image, mask: Image.Image, colour: RGB, at: tuple[int, int] = (0, 0)) -> None:
    """Colour ``image`` with ``colour`` where ``mask`` (L, 0-255 coverage) is set, ``mask`` placed at ``at``."""
    image.paste(Image.new("RGB", mask.size, colour), at, mask)


# -- a line -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class RenderedLine:
    """A rendered text line.

    Fields:
        image: the RGB image.
        text: its text (the label).
        char_quads: one quadrilateral per character of ``text`` ((n, 4, 2) pixels).
        quad: the line's quadrilateral ((4, 2)).
        params: how it was drawn (font, size, spacing, colours, background), for the label.
    """

    image: Image.Image
    text: str
    char_quads: np.ndarray
    quad: np.ndarray
    params: dict


Style = tuple[RGB, RGB, str]  # (background colour, text colour, background kind), as ``colours`` draws them


def render_line(text: str, font: Font, size: int, rng: np.random.Generator, style: Style | None = None) -> RenderedLine:
    """Render one line of ``text`` in ``font`` at ``size`` pixels on a drawn background (``style``:
    fixed colours and background instead of drawn ones)."""
    if not text.strip():
        raise ValueError("cannot render an empty line")
    pf = pil_font(font.path, font.index, size)
    spacing = round(float(rng.uniform(0.0, 0.25)) * size, 1) if rng.random() < 0.3 else 0.0
    pad_x, pad_y = (int(round(v * size)) for v in rng.uniform(0.05, 0.5, 2))
    ascent, descent = pf.getmetrics()
    width = int(np.ceil(text_width(text, pf, spacing))) + 2 * pad_x
    height = ascent + descent + 2 * pad_y
    mask = Image.new("L", (width, height), 0)
    boxes = draw_text(mask, (pad_x, pad_y), text, pf, spacing)
    # Box extents beyond the canvas (an overhanging glyph) would sit outside the image: grow it.
    over = np.ceil(np.maximum(0, [-boxes[:, 0].min(), -boxes[:, 1].min(), boxes[:, 2].max() - width,
                                  boxes[:, 3].max() - height])).astype(int)
    if over.any():
        grown = Image.new("L", (width + over[0] + over[2], height + over[1] + over[3]), 0)
        grown.paste(mask, (int(over[0]), int(over[1])))
        mask, boxes = grown, boxes + [over[0], over[1], over[0], over[1]]
    bg, fg, kind = style or colours(rng)
    image = background(mask.size, bg, kind, rng)
    paint(image, mask, fg)
    quads = np.stack([geometry.box_to_quad(b) for b in boxes])
    params = {"font": font.id, "size": size, "spacing": spacing, "background": kind, "bg": list(bg), "fg": list(fg)}
    return RenderedLine(image, text, quads, ink_quad(text, boxes), params)


# -- a page -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class PageLine:
    """One text line of a page.

    Fields:
        text: the line's text.
        quad: its quadrilateral on the page ((4, 2) pixels).
        font: the font id.
        size: the font size in pixels.
        docs: the corpus documents its block's text was cut from (empty for generated text).
    """

    text: str
    quad: np.ndarray
    font: str
    size: int
    docs: tuple[str, ...] = ()


@dataclasses.dataclass
class RenderedPage:
    """A rendered page: the image, its lines, and how it was laid out."""

    image: Image.Image
    lines: list[PageLine]
    params: dict


_NO_LINE_START = set("，。、；：？！”’）》】」』…%")


def _wrap(text: str, font: ImageFont.FreeTypeFont, width: float, indent: float) -> list[str]:
    """Greedy wrap by character advance (Chinese breaks between any two characters)."""
    lines, current, used, limit = [], "", 0.0, width - indent
    for ch in text:
        advance = font.getlength(ch)
        # Chinese typesetting never starts a line with closing punctuation: it hangs in the margin.
        if current and used + advance > limit and ch not in _NO_LINE_START:
            lines.append(current)
            current, used, limit = "", 0.0, width
        current += ch
        used += advance
    if current:
        lines.append(current)
    return lines


def _block(lines: list[str], font: Font, size: int, width: int, indent: float, leading: float,
           docs: tuple[str, ...]) -> tuple[Image.Image, list[PageLine]]:
    """A block's coverage mask and its lines (quads in block coordinates)."""
    pf = pil_font(font.path, font.index, size)
    ascent, descent = pf.getmetrics()
    step = ascent + descent + leading
    mask = Image.new("L", (width, int(np.ceil(step * len(lines) - leading)) + 2), 0)
    out = []
    for k, text in enumerate(lines):
        x = indent if k == 0 else 0.0
        stripped = text.strip()
        x += pf.getlength(text[:len(text) - len(text.lstrip())])
        if not stripped:
            continue
        boxes = draw_text(mask, (x, k * step), stripped, pf)
        out.append(PageLine(stripped, ink_quad(stripped, boxes), font.id, size, docs))
    return mask, out


def render_page(source: TextSource, fonts: list[Font], allowed: dict[str, frozenset[str]], rng: np.random.Generator,
                size: tuple[int, int], font_px: tuple[int, int], max_block_rotate: float = 3.0,
                block_rotate_prob: float = 0.2, style: Style | None = None) -> RenderedPage:
    """Lay out a page of ``size`` (width, height): headings and paragraphs of corpus text in one or two
    columns, some blocks turned by up to ``max_block_rotate`` degrees.

    Args:
        source: where the text comes from (its split decides which documents).
        fonts: the fonts to choose from (one for the body, one for the headings).
        allowed: per font id, the characters it may draw (the charset and the font's glyphs).
        font_px: the body text's size range in pixels (headings are 1.2-1.8 times larger).
        style: fixed colours and background for the whole page (text in one colour) instead of drawn ones.
    """
    width, height = size
    body_font, head_font = fonts[int(rng.integers(len(fonts)))], fonts[int(rng.integers(len(fonts)))]
    body_px = int(rng.integers(font_px[0], font_px[1] + 1))
    bg, fg, kind = style or colours(rng)
    page = background(size, bg, kind, rng)
    margin = int(width * rng.uniform(0.04, 0.09))
    columns = 2 if width >= 25 * body_px and rng.random() < 0.4 else 1
    gutter = int(body_px * rng.uniform(1.0, 2.5))
    col_w = (width - 2 * margin - (columns - 1) * gutter) // columns
    leading = float(body_px * rng.uniform(0.3, 0.9))
    lines: list[PageLine] = []
    docs: list[str] = []
    for col in range(columns):
        x0, y = margin + col * (col_w + gutter), float(margin)
        first = True
        while y < height - margin - body_px:
            heading = rng.random() < (0.6 if first and col == 0 else 0.2)
            first = False
            if heading:
                font, px = head_font, int(round(body_px * rng.uniform(1.2, 1.8)))
                pf = pil_font(font.path, font.index, px)
                chars = max(2, min(20, int(col_w / max(1.0, pf.getlength("国")))))
                sample = source.line(rng, chars, allowed[font.id],
                                     kind=["corpus", "corpus", "date", "amount", "phone"][int(rng.integers(5))])
                while px > body_px and text_width(sample.text, pf) > col_w:  # shrink a heading to fit first
                    px -= 1
                    pf = pil_font(font.path, font.index, px)
                texts = _wrap(sample.text, pf, col_w, 0.0)[:1]
                indent = float(rng.uniform(0, 0.3)) * max(0.0, col_w - text_width(texts[0], pf))
                colour = fg if rng.random() < 0.7 else tuple(int(v) for v in rng.integers(0, 140, 3))
                if style is not None or abs(_luminance(colour) - _luminance(bg)) < 90:
                    colour = fg
            else:
                font, px, colour = body_font, body_px, fg
                pf = pil_font(font.path, font.index, px)
                per_line = max(1, int(col_w / max(1.0, pf.getlength("国"))))
                n_lines = int(rng.integers(2, 9))
                sample = source.passage(rng, per_line * n_lines, allowed[font.id])
                indent = 2 * pf.getlength("国") if rng.random() < 0.7 else 0.0
                texts = _wrap(sample.text, pf, col_w, indent)[:n_lines]
            mask, block_lines = _block(texts, font, px, col_w, indent, leading if not heading else px * 0.3,
                                       sample.docs)
            if not block_lines:
                continue
            step = mask.size[1] / len(texts)
            room = int((height - margin - y) // step)
            if len(block_lines) > room >= 1 and not heading:  # the page's last paragraph: as many lines as fit
                texts = texts[:room]
                mask, block_lines = _block(texts, font, px, col_w, indent, leading, sample.docs)
            quads = np.stack([ln.quad for ln in block_lines])
            if rng.random() < block_rotate_prob and max_block_rotate > 0:
                angle = float(rng.uniform(-max_block_rotate, max_block_rotate))
                w, h = mask.size
                turned, moved, _ = geometry.warp(mask, geometry.rotation(angle, (w / 2, h / 2)), quads, fill=0)
                if turned.size[0] <= col_w + 2 * margin // 3:  # keep it inside the column (and its margin)
                    mask, quads = turned, moved
            if y + mask.size[1] > height - margin:
                break
            at = (int(x0 + (col_w - mask.size[0]) // 2) if mask.size[0] > col_w else int(x0), int(y))
            paint(page, mask, colour, at)
            for line, quad in zip(block_lines, quads, strict=True):
                line.quad = quad + at
                lines.append(line)
            docs.extend(d for d in sample.docs if d not in docs)
            y += mask.size[1] + leading + body_px * rng.uniform(0.3, 1.2)
    params = {"body_font": body_font.id, "heading_font": head_font.id, "body_px": body_px, "columns": columns,
              "background": kind, "bg": list(bg), "fg": list(fg), "docs": docs}
    return RenderedPage(page, lines, params)


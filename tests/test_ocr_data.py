"""The OCR synthetic data engine (``sampan.vision``, ``sampan data build-ocr``): boxes on the ink, under
rotation and perspective too, pixel-checked; reproducible builds; held-out fonts and documents kept
out of train; the charset; clear errors for bad settings.

Needs the CJK fonts `make system-deps` installs (a train font and the held-out wqy-zenhei); without
them the file is skipped and says which packages to install. Cost: 6 s of tests, 10 s wall with
imports, on this 2-core machine (three tiny builds, one of them with two workers).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from sampan.text.corpus.document import held_out
from sampan.text.corpus.registry import CORPORA, SPLIT_SEED
from sampan.vision import fonts as font_catalogue
from sampan.vision.augment import AugmentConfig, augment
from sampan.vision.build import OcrDataConfig, build_ocr_data, read_records
from sampan.vision.charset import ASCII, GB2312_LEVEL1, load_charset, normalize_text
from sampan.vision.render import render_line, render_page
from sampan.vision.text_sources import KINDS, TextSource

try:
    SPLIT_FONTS = font_catalogue.select_fonts()
except FileNotFoundError as e:  # a machine without the fonts: say what to install
    pytest.skip(f"{e}", allow_module_level=True)



# Bilinear resampling leaves dark (< 128) ink at most half a pixel past the exact edge (100 seeds checked).
GROW = 0.5
WHITE, BLACK = (255, 255, 255), (0, 0, 0)
CLEAN = ((255, 255, 255), (0, 0, 0), "flat")
TEXT = "我们在2024年3月5日买了iPhone 15，花¥1,234.50。"
# A tiny in-memory corpus for page layout (no corpus loading in the render tests).
TOY = {"toy": [(f"toy-{i}", "天下大势，分久必合，合久必分。周末七国分争，并入于秦。及秦灭之后，楚、汉分争，又并入于汉。"
                * 3) for i in range(4)]}


def _cross(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return u[..., 0] * v[..., 1] - u[..., 1] * v[..., 0]


def _polygon_mask(size: tuple[int, int], quads, grow: float = 0.0) -> np.ndarray:
    """Pixels whose centre lies inside any (convex) quad, each edge pushed out by ``grow`` pixels.
    Pixel (i, j) covers [i, i + 1) x [j, j + 1), so its centre is (i + 0.5, j + 0.5)."""
    w, h = size
    inside = np.zeros((h, w), dtype=bool)
    for quad in np.asarray(quads, dtype=np.float64).reshape(-1, 4, 2):
        # Only the pixels of the quad's bounding box (grown) can be inside it.
        x0, y0 = np.clip(np.floor(quad.min(0) - grow - 1), 0, None).astype(int)
        x1, y1 = np.ceil(quad.max(0) + grow + 1).astype(int)
        ys, xs = np.mgrid[y0:min(y1, h), x0:min(x1, w)]
        centres = np.stack([xs + 0.5, ys + 0.5], -1)
        sign = np.sign(_cross(quad[1] - quad[0], quad[2] - quad[1])) or 1.0  # clockwise on screen: +1
        here = np.ones(xs.shape, dtype=bool)
        for a, b in zip(quad, np.roll(quad, -1, axis=0), strict=True):
            length = np.linalg.norm(b - a)
            if length:
                here &= sign * _cross(b - a, centres - a) / length >= -grow - 1e-9  # signed distance, >= 0 inside
        inside[ys, xs] |= here
    return inside


def _ink(image: Image.Image, threshold: int = 128) -> np.ndarray:
    return np.asarray(image.convert("L")) < threshold


@pytest.mark.parametrize("font", [f for fs in SPLIT_FONTS.values() for f in fs], ids=lambda f: f.id)
def test_line_character_boxes_lie_inside_the_image_and_cover_the_ink(font):
    line = render_line(TEXT, font, 28, np.random.default_rng(0), style=CLEAN)
    w, h = line.image.size
    assert line.char_quads.shape == (len(TEXT), 4, 2)
    assert (line.char_quads >= 0).all() and (line.char_quads[..., 0] <= w).all() and (line.char_quads[..., 1] <= h).all()
    ink = _ink(line.image, 255)  # every pixel with any ink at all (the background is pure white)
    assert ink.sum() > 500
    # All ink inside the characters' boxes; every visible character's box holds ink; the line box is tight.
    assert not (ink & ~_polygon_mask((w, h), line.char_quads)).any()
    for ch, quad in zip(TEXT, line.char_quads, strict=True):
        if ch.strip():
            assert (ink & _polygon_mask((w, h), [quad])).any(), f"no ink in the box of {ch!r}"
    ys, xs = np.nonzero(ink)
    assert np.array_equal(line.quad[0], (xs.min(), ys.min())) and np.array_equal(line.quad[2], (xs.max() + 1, ys.max() + 1))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rotation_and_perspective_keep_the_quadrilaterals_on_the_ink(seed):
    rng = np.random.default_rng(seed)
    font = SPLIT_FONTS["train"][seed % len(SPLIT_FONTS["train"])]
    line = render_line(TEXT, font, 32, rng, style=CLEAN)
    geometric = AugmentConfig(rotate_prob=1.0, max_rotate_deg=12.0, perspective_prob=1.0, max_perspective=0.12,
                              lowres_prob=0, blur_prob=0, noise_prob=0, jpeg_prob=0)
    points = np.concatenate([line.quad[None], line.char_quads])
    image, moved, applied = augment(line.image, points, geometric, rng, fill=WHITE)
    assert set(applied) == {"rotate", "perspective"} and abs(applied["rotate"]) > 0.5
    w, h = image.size
    ink = _ink(image)
    assert ink.sum() > 500
    # All dark ink within the moved boxes, up to resampling's half pixel (GROW).
    assert not (ink & ~_polygon_mask((w, h), [moved[0]], grow=GROW)).any()
    assert not (ink & ~_polygon_mask((w, h), moved[1:], grow=GROW)).any()
    for ch, quad in zip(TEXT, moved[1:], strict=True):
        if ch.strip():
            assert (ink & _polygon_mask((w, h), [quad])).any(), f"the box of {ch!r} left its ink"
    # A tilted line's box is no longer axis-aligned: the corners really moved with the pixels.
    assert not np.allclose(moved[0][:, 1], moved[0][0, 1], atol=1)


def test_page_line_quadrilaterals_are_on_the_ink_with_turned_blocks_and_a_tilted_page():
    rng = np.random.default_rng(4)
    fonts = SPLIT_FONTS["train"]
    allowed = {f.id: f.charset() for f in fonts}
    page = render_page(TextSource(TOY, "train", {"corpus": 1.0}), fonts, allowed, rng, (400, 520), (14, 18),
                       max_block_rotate=6.0, block_rotate_prob=1.0, style=CLEAN)
    assert len(page.lines) >= 6
    assert not [ln.text for ln in page.lines if ln.text[0] in "，。、；：？！”）》"]  # Chinese line-breaking rule
    quads = np.stack([ln.quad for ln in page.lines])
    turned = sum(not np.allclose(q[:, 1], q[0, 1], atol=0.5) for q in quads)
    assert turned >= 3  # the blocks really were turned
    tilt = AugmentConfig(rotate_prob=1.0, max_rotate_deg=4.0, perspective_prob=1.0, max_perspective=0.05,
                         lowres_prob=0, blur_prob=0, noise_prob=0, jpeg_prob=0)
    image, moved, _ = augment(page.image, quads, tilt, rng, fill=WHITE)
    ink = _ink(image)
    assert not (ink & ~_polygon_mask(image.size, moved, grow=GROW)).any()
    for line, quad in zip(page.lines, moved, strict=True):
        assert (ink & _polygon_mask(image.size, [quad])).sum() > 10, f"no ink under line {line.text!r}"


def test_generated_lines_and_held_out_latin_words():
    train, test = TextSource(TOY, "train"), TextSource(TOY, "test")
    assert train.words and test.words and not set(train.words) & set(test.words)
    rng = np.random.default_rng(0)
    lines = {kind: [train.line(rng, 24, kind=kind) for _ in range(40)] for kind in KINDS}
    assert any(re.fullmatch(r"\d{4}年\d{1,2}月\d{1,2}日", x.text) for x in lines["date"])
    assert any(re.fullmatch(r"\d{4}-\d\d-\d\d", x.text) for x in lines["date"])
    assert any(re.fullmatch(r"¥\d{1,3}(,\d{3})*\.\d\d", x.text) for x in lines["amount"])
    assert any(re.search(r"[A-Za-z]", x.text) and re.search(r"[\u4e00-\u9fff]", x.text) for x in lines["mixed"])
    assert all(x.docs and x.source == "toy" for x in lines["corpus"]) and not any(x.docs for x in lines["phone"])
    assert all(1 <= len(x.text) <= 24 for xs in lines.values() for x in xs)
    assert normalize_text("附图片１张　ＡＢＣ") == "附图片1张 ABC"


def _tiny(out: Path, **kw) -> OcrDataConfig:
    settings = dict(out=str(out), train_lines=12, test_lines=6, train_pages=1, test_pages=1, corpora=("sanguo",),
                    line_px=(16, 24), page_size=(320, 400), page_px=(12, 18))
    return OcrDataConfig(**(settings | kw))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ocr") / "a"
    build_ocr_data(_tiny(root))
    return root


def test_a_build_is_reproducible_byte_for_byte_and_the_seed_matters(built, tmp_path):
    again = tmp_path / "b"
    build_ocr_data(_tiny(again, workers=2))  # other workers, same bytes: each image has its own generator
    first, second = _files(built), _files(again)
    assert len(first) == 12 + 6 + 1 + 1 + 4 + 2 and first == second
    other = tmp_path / "c"
    build_ocr_data(_tiny(other, seed=1))
    assert read_records(other, "train", "lines") != read_records(built, "train", "lines")
    assert _files(other)["train/lines/000000.jpg"] != first["train/lines/000000.jpg"]


def test_held_out_fonts_and_documents_never_appear_in_train(built):
    manifest = json.loads((built / "manifest.json").read_text(encoding="utf-8"))
    held = {s.id for s in font_catalogue.CATALOGUE if s.held_out}
    fraction = CORPORA["sanguo"].held_out
    for split in ("train", "test"):
        lines, pages = read_records(built, split, "lines"), read_records(built, split, "pages")
        used_fonts = {r["font"] for r in lines} | {ln["font"] for p in pages for ln in p["lines"]}
        docs = {d for r in lines for d in r["docs"]} | {d for p in pages for ln in p["lines"] for d in ln["docs"]}
        assert used_fonts and docs
        assert (used_fonts <= held) == (split == "test") and (not used_fonts & held) == (split == "train")
        assert all(held_out(d, fraction, SPLIT_SEED) == (split == "test") for d in docs)
        assert manifest["splits"][split]["fonts"] == [f.id for f in SPLIT_FONTS[split]]


def test_the_charset_covers_gb2312_level1_and_every_label(built):
    manifest = json.loads((built / "manifest.json").read_text(encoding="utf-8"))
    chars = load_charset(built / "charset.txt", manifest["charset"]["sha256"])
    assert len(GB2312_LEVEL1) == 3755 and set(GB2312_LEVEL1) <= set(chars)
    assert chars[:len(ASCII)] == list(ASCII) and len(set(chars)) == len(chars) == manifest["charset"]["total"]
    labels = [r["text"] for s in ("train", "test") for r in read_records(built, s, "lines")]
    labels += [ln["text"] for s in ("train", "test") for p in read_records(built, s, "pages") for ln in p["lines"]]
    assert len(labels) > 18 and set("".join(labels)) <= set(chars)
    with pytest.raises(ValueError, match="SHA-256"):
        load_charset(built / "charset.txt", "0" * 64)


@pytest.mark.parametrize(("change", "message"), [
    ({"corpora": ("nope",)}, "unknown corpora"),
    ({"line_px": (40, 20)}, "--line-px"),
    ({"train_lines": 0, "test_lines": 0, "train_pages": 0, "test_pages": 0}, "nothing to build"),
    ({"page_size": (100, 100)}, "too small"),
    ({"line_augment": {"rotate_prob": 2.0}}, "rotate_prob"),
    ({"page_augment": {"jpeg_quality": (90, 10)}}, "jpeg_quality"),
])
def test_bad_settings_are_clear_errors(tmp_path, change, message):
    with pytest.raises(ValueError, match=message):
        _tiny(tmp_path / "x", **change)


def test_font_errors_name_the_packages_to_install(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown font 'comic-sans'"):
        font_catalogue.select_fonts(("comic-sans",))
    with pytest.raises(ValueError, match="--held-out-fonts is empty"):
        font_catalogue.select_fonts(held_out=())
    with pytest.raises(FileNotFoundError, match="no train font among the fonts in use"):
        font_catalogue.select_fonts(("wqy-zenhei",))
    # A machine with no CJK font at all: the error says which apt packages to install.
    monkeypatch.setattr(font_catalogue, "FONT_ROOT", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no fc-list either
    font_catalogue.installed_fonts.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match="fonts-wqy-microhei fonts-wqy-zenhei fonts-arphic-uming"):
            font_catalogue.select_fonts()
    finally:
        font_catalogue.installed_fonts.cache_clear()


@pytest.mark.skipif(not shutil.which("fc-list"), reason="no fontconfig (fc-list) on this machine")
def test_fonts_outside_debians_layout_are_found_through_fontconfig(tmp_path, monkeypatch):
    monkeypatch.setattr(font_catalogue, "FONT_ROOT", tmp_path)  # nothing where Debian puts fonts
    font_catalogue.installed_fonts.cache_clear()
    try:
        found = font_catalogue.installed_fonts()
    finally:
        font_catalogue.installed_fonts.cache_clear()
    assert [(f.id, f.path, f.index) for f in found] == [(f.id, f.path, f.index) for f in font_catalogue.installed_fonts()]


def test_the_command_refuses_another_directory_and_reports_bad_flags(tmp_path, capsys):
    from sampan.cli import main

    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("mine", encoding="utf-8")
    assert main(["data", "build-ocr", "--out", str(occupied), "--corpora", "sanguo"]) == 2
    assert "not a data set built by `sampan data build-ocr`" in capsys.readouterr().err
    assert (occupied / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert main(["data", "build-ocr", "--out", str(tmp_path / "o"), "--line-px", "40,20"]) == 2
    assert "--line-px" in capsys.readouterr().err

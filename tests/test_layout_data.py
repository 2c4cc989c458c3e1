"""`sampan data build-layout`: rendered document pages with layout boxes read from Chromium's DOM.

Two builds of 3 train + 2 test pages (the same seed twice, with 1 and 2 workers) through the real headless Chromium
(/usr/bin/chromium, `make system-deps` installs it) share one module fixture; costs ~10 s on 2 busy cores.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from PIL import Image

from sampan.vision.fonts import CATALOGUE
from sampan.vision.layout.build import LayoutDataConfig, build_layout_data, read_pages
from sampan.vision.layout.classes import CATEGORY_IDS, CLASSES
from sampan.vision.layout.templates import TEMPLATES, templates_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SETTINGS = {"train_pages": 3, "test_pages": 2, "seed": 0, "corpora": ("sanguo", "reviews"), "scan_fraction": 0.5}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The same seed built twice: in this process, then in two forked workers (each its own Chromium)."""
    root = tmp_path_factory.mktemp("layout")
    out = [root / "a", root / "b"]
    manifests = [build_layout_data(LayoutDataConfig(out=str(o), workers=w, **SETTINGS)) for o, w in zip(out, (1, 2), strict=True)]
    return out, manifests


def test_boxes_lie_inside_their_page_with_positive_size_and_a_cdla_class(builds):
    (out, _), _ = builds
    for split in ("train", "test"):
        coco = json.loads((out / f"{split}.json").read_text(encoding="utf-8"))
        assert [c["name"] for c in coco["categories"]] == list(CLASSES)
        images = {im["id"]: im for im in coco["images"]}
        assert len(images) == SETTINGS[f"{split}_pages"]
        for im in images.values():
            assert Image.open(out / im["file_name"]).size == (im["width"], im["height"])
        assert coco["annotations"]
        for a in coco["annotations"]:
            x, y, w, h = a["bbox"]
            im = images[a["image_id"]]
            assert w > 0 and h > 0 and a["area"] == pytest.approx(w * h, abs=0.05)
            assert 0 <= x and 0 <= y and x + w <= im["width"] + 0.01 and y + h <= im["height"] + 0.01
            assert a["category_id"] in CATEGORY_IDS.values() and a["iscrowd"] == 0
        # Every page has its header and footer, and the body holds text.
        for im in images.values():
            names = {CLASSES[a["category_id"] - 1] for a in coco["annotations"] if a["image_id"] == im["id"]}
            assert {"header", "footer", "text"} <= names, (im["file_name"], names)


def test_the_same_seed_gives_the_same_html_and_boxes_with_any_number_of_workers(builds):
    (a, b), (ma, mb) = builds
    for split in ("train", "test"):
        assert (a / f"{split}.json").read_text(encoding="utf-8") == (b / f"{split}.json").read_text(encoding="utf-8")
        for page in read_pages(a, split):
            assert (a / page["html"]).read_text(encoding="utf-8") == (b / page["html"]).read_text(encoding="utf-8")
    assert ma["checksums"] == mb["checksums"]  # the images too, byte for byte
    assert ma["splits"]["train"]["pages"] == 3 and sum(ma["splits"]["train"]["classes"].values()) > 0


def test_held_out_templates_and_fonts_never_reach_train(builds):
    (out, _), (manifest, _) = builds
    held_templates = {t.name for t in TEMPLATES if t.held_out}
    held_fonts = {s.id for s in CATALOGUE if s.held_out}
    assert held_templates and not held_templates & {t.name for t in templates_for("train")}
    assert held_templates <= {t.name for t in templates_for("test")}
    for page in read_pages(out, "train"):
        assert page["template"] not in held_templates and not page["held_out_template"]
        assert page["font"] not in held_fonts and not page["held_out_font"]
    assert not set(manifest["splits"]["train"]["fonts"]) & held_fonts
    assert not set(manifest["splits"]["train"]["templates"]) & held_templates


class _Tables(HTMLParser):
    """Each table's cell texts by its data-bid, read back from the laid-out HTML."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[int, list[list[str]]] = {}
        self._bid: int | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._bid = int(attrs["data-bid"])
            self.tables[self._bid] = []
        elif tag == "tr" and self._bid is not None:
            self.tables[self._bid].append([])
        elif tag in ("td", "th") and self._bid is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[self._bid][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table":
            self._bid = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_tables_in_pages_jsonl_have_the_rows_and_columns_of_the_html(builds):
    (out, _), _ = builds
    seen = 0
    for split in ("train", "test"):
        for page in read_pages(out, split):
            parser = _Tables()
            parser.feed((out / page["html"]).read_text(encoding="utf-8"))
            tables = [b for b in page["structure"] if b["class"] == "table"]
            assert {t["id"] for t in tables} == set(parser.tables)
            for t in tables:
                cells = parser.tables[t["id"]]
                assert (t["rows"], t["cols"]) == (len(cells), len(cells[0]))
                assert all(len(row) == t["cols"] for row in cells)
                assert t["cells"] == cells
                seen += 1
            # The structure is the page's boxes, in reading order, header first and footer last.
            assert [b["id"] for b in page["structure"]] == sorted(b["block"] for b in page["boxes"])
            assert page["structure"][0]["class"] == "header" and page["structure"][-1]["class"] == "footer"
    assert seen, "no table among the pages: pick a seed whose pages hold one"


def test_coco_files_load_in_pycocotools(builds):
    from pycocotools.coco import COCO

    (out, _), (manifest, _) = builds
    for split in ("train", "test"):
        coco = COCO(str(out / f"{split}.json"))
        assert len(coco.getImgIds()) == SETTINGS[f"{split}_pages"]
        counts = {c: len(coco.getAnnIds(catIds=[CATEGORY_IDS[c]])) for c in CLASSES}
        assert counts == manifest["splits"][split]["classes"]


def test_scanned_pages_are_jpeg_with_their_boxes_moved_along(builds):
    (out, _), (manifest, _) = builds
    pages = read_pages(out, "train") + read_pages(out, "test")
    scanned = [p for p in pages if p["scanned"]]
    assert scanned, "no scanned page at scan_fraction 0.5: pick another seed"
    for p in scanned:
        assert p["image"].endswith(".jpg")
        if abs(p["scan"].get("rotate", 0)) > 0.1:  # the canvas grows to hold the turned page
            assert (p["width"], p["height"]) != (800, 1131)
    assert sum(s["scanned"] for s in manifest["splits"].values()) == len(scanned)


def test_missing_chromium_names_make_system_deps(tmp_path, monkeypatch):
    import sampan.vision.layout.browser as browser

    monkeypatch.setattr(browser, "CHROMIUM", str(tmp_path / "no-chromium"))
    with pytest.raises(FileNotFoundError, match="make system-deps"):
        build_layout_data(LayoutDataConfig(out=str(tmp_path / "out"), train_pages=1, test_pages=0))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("bad, message", [({"train_pages": 0, "test_pages": 0}, "nothing to build"),
                                          ({"scan_fraction": 1.5}, "scan-fraction"),
                                          ({"corpora": ("nope",)}, "unknown corpora"),
                                          ({"workers": 0}, "workers")])
def test_bad_settings_are_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=message):
        LayoutDataConfig(out="unused", **bad)


def test_a_directory_that_is_not_a_layout_build_is_refused(tmp_path):
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(FileExistsError, match="pick another --out"):
        build_layout_data(LayoutDataConfig(out=str(tmp_path), train_pages=1, test_pages=0))
    assert (tmp_path / "keep.txt").read_text(encoding="utf-8") == "mine"


def test_classes_are_cdlas_ten_in_order():
    assert CLASSES == ("text", "title", "figure", "figure_caption", "table", "table_caption", "header", "footer",
                       "reference", "equation")
    assert [CATEGORY_IDS[c] for c in CLASSES] == list(range(1, 11))


def test_the_saved_html_lays_out_to_the_recorded_boxes(builds):
    from sampan.vision.layout.browser import PageRenderer

    (out, _), _ = builds
    page = next(p for split in ("train", "test") for p in read_pages(out, split) if not p["scanned"])
    with PageRenderer((800, 1131)) as renderer:
        _, measured, _ = renderer.render((out / page["html"]).read_text(encoding="utf-8"))
    got = {m["bid"]: [round(min(max(v, 0.0), lim), 2) for v, lim in zip(m["box"], (800, 1131, 800, 1131), strict=True)]
           for m in measured}
    assert {b["block"]: b["bbox"] for b in page["boxes"]} == {k: got[k] for k in (b["block"] for b in page["boxes"])}

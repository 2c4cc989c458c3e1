"""``sampan data build-layout``: rendered Chinese document pages with exact layout boxes, in one
seeded, reproducible pass.

Layout of the output directory (it appears complete or not at all)::

    manifest.json            counts per split and class, templates, fonts, settings, SHA-256 of every file
    train.json / test.json   COCO detection files (file_name relative to this directory)
    train/pages.jsonl        one record per page: template, font, columns, seed, style, scan, boxes, and
                             the ground-truth structure (blocks in reading order: class, text, table cells)
    train/images/000000.png  the page (a scanned one is .jpg)
    train/html/000000.html   the HTML as laid out (units that did not fit removed)
    test/...                 the same; test draws from every template and font, train never from the
                             held-out ones, and test text comes from the corpora's held-out documents

Each page is drawn from ``numpy.random.default_rng([seed, split, index])``, so it depends only on the
seed and its position: the same seed gives the same HTML and boxes with any number of workers.
"""

from __future__ import annotations

import dataclasses
import io
import json
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sampan.vision.layout.classes import CLASSES, check_class

KIND = "sampan-layout-data"
FORMAT_VERSION = 1
SPLITS = ("train", "test")
MANIFEST = "manifest.json"


@dataclasses.dataclass
class LayoutDataConfig:
    """What ``sampan data build-layout`` renders, and how.

    Fields:
        out: the output directory (replaced whole if it holds an earlier layout build; any other
            non-empty directory is refused).
        train_pages: pages in the train split.
        test_pages: pages in the test split.
        seed: the seed every page's generator is derived from.
        corpora: the corpora the text is cut from (sampan.text.corpus: news, sanguo, reviews, poetry or
            debian-zh once fetched); their held-out documents feed the test split.
        fonts: the catalogue fonts to use (sampan.vision.fonts; empty: every installed one).
        held_out_fonts: fonts rendered only into the test split (none: the catalogue's fixed choice).
        page_size: the viewport, width and height in pixels (A4's proportions at 800 x 1131).
        scan_fraction: the share of pages degraded like a scan (skew, blur, noise, JPEG), drawn per page.
        clean_format: the file format of pages that are not scanned (scanned ones are JPEG).
        file_quality: the JPEG quality files are saved at.
        workers: processes rendering in parallel, each with its own Chromium (the result does not
            depend on it; needs fork).
    """

    out: str
    train_pages: int = 200
    test_pages: int = 50
    seed: int = 0
    corpora: tuple[str, ...] = ("news", "sanguo", "reviews")
    fonts: tuple[str, ...] = ()
    held_out_fonts: tuple[str, ...] | None = None
    page_size: tuple[int, int] = (800, 1131)
    scan_fraction: float = 0.3
    clean_format: Literal["png", "jpg"] = "png"
    file_quality: int = 92
    workers: int = 1

    def __post_init__(self) -> None:
        from sampan.utils.config import resolve_nested

        resolve_nested(self)
        for name in ("train_pages", "test_pages"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not (self.train_pages or self.test_pages):
            raise ValueError("nothing to build: --train-pages and --test-pages are both 0")
        from sampan.text.corpus.registry import CORPORA

        unknown = [c for c in self.corpora if c not in CORPORA]
        if unknown:
            raise ValueError(f"unknown corpora {unknown}; known corpora: {', '.join(CORPORA)}")
        if not self.corpora:
            raise ValueError("--corpora is empty: the pages' text is cut from at least one corpus")
        width, height = self.page_size
        if not (400 <= width <= 2400 and 400 <= height <= 3400):
            raise ValueError(f"--page-size must be WIDTH,HEIGHT within 400-2400 x 400-3400 pixels, got {width},{height}")
        if not 0.0 <= self.scan_fraction <= 1.0:
            raise ValueError(f"--scan-fraction is a share in [0, 1], got {self.scan_fraction}")
        if not 50 <= self.file_quality <= 100:
            raise ValueError(f"--file-quality must be in [50, 100], got {self.file_quality}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")


@dataclasses.dataclass
class _State:
    config: LayoutDataConfig
    out: Path
    fonts: dict[str, list]  # split -> [Font] it draws from
    held_out_fonts: set[str]
    drawers: dict[str, Any]  # split -> ContentDrawer


_STATE: _State | None = None  # set before the work starts; forked workers inherit it
_RENDERER = None  # this process's Chromium, started on its first page


def _renderer():
    global _RENDERER
    if _RENDERER is None:
        from sampan.vision.layout.browser import PageRenderer

        assert _STATE is not None
        _RENDERER = PageRenderer(_STATE.config.page_size)
        if multiprocessing.parent_process() is not None:
            # A forked worker runs no atexit hooks: close its browser from multiprocessing's own exit.
            multiprocessing.util.Finalize(None, _close_renderer, exitpriority=10)
    return _RENDERER


def _close_renderer() -> None:
    global _RENDERER
    if _RENDERER is not None:
        _RENDERER.close()
        _RENDERER = None


def _make_page(task: tuple[str, int]) -> dict:
    from PIL import Image

    from sampan.vision.layout.html import page_html
    from sampan.vision.layout.scan import scan
    from sampan.vision.layout.templates import templates_for

    split, index = task
    state = _STATE
    assert state is not None
    config = state.config
    rng = np.random.default_rng([config.seed, SPLITS.index(split), index])
    # The page's top-level choices come first, so a change further down leaves them where they were.
    templates = templates_for(split)
    template = templates[int(rng.integers(len(templates)))]
    fonts = state.fonts[split]
    font = fonts[int(rng.integers(len(fonts)))]
    scanned = bool(rng.random() < config.scan_fraction)
    content = state.drawers[split].page(rng, template, font.charset(), config.page_size, font.path)
    html, style = page_html(content, template, font.spec.family, config.page_size, rng)
    png, measured, laid_out = _renderer().render(html)

    width, height = config.page_size
    blocks = {b.id: b for b in [*content.header, *content.front, *(b for u in content.units for b in u),
                                *content.footer]}
    boxes = []
    for m in measured:
        x0, y0, x1, y1 = (min(max(v, 0.0), lim) for v, lim in zip(m["box"], (width, height, width, height), strict=True))
        if x1 - x0 >= 1 and y1 - y0 >= 1:  # an empty element (no text) has no box to find
            boxes.append({"block": m["bid"], "class": check_class(m["cls"]), "bbox": [x0, y0, x1, y1]})
    image = Image.open(io.BytesIO(png)).convert("RGB")
    applied: dict = {}
    if scanned:
        image, moved, applied = scan(image, [b["bbox"] for b in boxes], rng)
        for b, bbox in zip(boxes, moved, strict=True):
            b["bbox"] = bbox
    for b in boxes:
        b["bbox"] = [round(v, 2) for v in b["bbox"]]
    fmt = "jpg" if scanned else config.clean_format
    name = f"{split}/images/{index:06d}.{fmt}"
    path = state.out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jpg":
        image.save(path, format="JPEG", quality=config.file_quality)
    else:
        image.save(path, format="PNG")
    html_name = f"{split}/html/{index:06d}.html"
    (state.out / html_name).parent.mkdir(parents=True, exist_ok=True)
    (state.out / html_name).write_text(laid_out, encoding="utf-8")
    by_block = {b["block"]: b["bbox"] for b in boxes}
    # Reading order is the DOM's: header, front matter, the body column by column, footer.
    structure = [blocks[bid].record() | {"bbox": by_block[bid]} for bid in blocks if bid in by_block]
    return {"id": f"{split}-{index:06d}", "image": name, "html": html_name, "width": image.size[0],
            "height": image.size[1], "template": template.name, "held_out_template": template.held_out,
            "font": font.id, "held_out_font": font.id in state.held_out_fonts, "columns": template.columns,
            "body_px": content.body_px, "seed": [config.seed, SPLITS.index(split), index], "style": style,
            "scanned": scanned, "scan": applied, "boxes": boxes, "structure": structure}


def _is_layout_build(directory: Path) -> bool:
    try:
        return json.loads((directory / MANIFEST).read_text(encoding="utf-8")).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def _run(tasks: list[tuple[str, int]], workers: int):
    """The records of ``tasks`` in order, rendered here or in ``workers`` forked processes."""
    if workers == 1 or len(tasks) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        try:
            yield from map(_make_page, tasks)
        finally:
            _close_renderer()
        return
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        yield from pool.map(_make_page, tasks, chunksize=4)


def build_layout_data(config: LayoutDataConfig, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Render the data set into ``config.out``; returns the manifest. Progress goes to ``log``."""
    global _STATE
    from sampan.utils.atomic import atomic_dir
    from sampan.vision.fonts import select_fonts
    from sampan.vision.layout.browser import check_browser
    from sampan.vision.layout.coco import coco_file
    from sampan.vision.layout.content import ContentDrawer
    from sampan.vision.text_sources import TextSource, load_documents

    out = Path(config.out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not _is_layout_build(out))):
        raise FileExistsError(f"{out} exists and is not a data set built by `sampan data build-layout`; "
                              "pick another --out (nothing was written)")
    check_browser()  # before anything loads: what a fresh machine most often lacks
    start = time.perf_counter()
    chosen = select_fonts(config.fonts, config.held_out_fonts)
    # Test pages use every font, seen and held out; train never sees a held-out one.
    fonts = {"train": chosen["train"], "test": chosen["train"] + chosen["test"]}
    held_out = {f.id for f in chosen["test"]}
    drawers = {s: ContentDrawer(TextSource(load_documents(config.corpora, s), s, {"corpus": 1.0})) for s in SPLITS}
    log(f"build-layout: fonts train {[f.id for f in fonts['train']]}, held out {sorted(held_out)}; corpora "
        f"{list(config.corpora)} ({time.perf_counter() - start:.1f} s to load)")
    counts = {"train": config.train_pages, "test": config.test_pages}
    records: dict[str, list[dict]] = {s: [] for s in SPLITS}
    rates = {}
    with atomic_dir(out) as tmp:
        _STATE = _State(config, tmp, fonts, held_out, drawers)
        try:
            for split, n in counts.items():
                if not n:
                    continue
                began, done = time.perf_counter(), 0
                for record in _run([(split, i) for i in range(n)], config.workers):
                    records[split].append(record)
                    done += 1
                    if done == n or done % max(1, n // 10) == 0:
                        rate = done / max(1e-9, time.perf_counter() - began)
                        log(f"build-layout: {split} {done:,}/{n:,} pages ({rate:.2f} pages/s)")
                rates[split] = round(n / max(1e-9, time.perf_counter() - began), 3)
        finally:
            _STATE = None
        for split in SPLITS:
            (tmp / split).mkdir(parents=True, exist_ok=True)
            with (tmp / split / "pages.jsonl").open("w", encoding="utf-8") as f:
                for row in records[split]:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            coco = coco_file(records[split], f"sampan build-layout {split} split, seed {config.seed}")
            (tmp / f"{split}.json").write_text(json.dumps(coco, ensure_ascii=False) + "\n", encoding="utf-8")
        manifest = _manifest(config, records, fonts, held_out, tmp, rates)
        (tmp / MANIFEST).write_text(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    log(f"build-layout: wrote {out} in {time.perf_counter() - start:.1f} s")
    return manifest


def _manifest(config: LayoutDataConfig, records: dict, fonts: dict, held_out: set[str], root: Path,
              rates: dict) -> dict[str, Any]:
    from sampan.utils.config import to_dict
    from sampan.utils.digest import file_sha256
    from sampan.vision.layout.templates import TEMPLATES

    splits = {}
    for split in SPLITS:
        pages = records[split]
        classes = Counter(b["class"] for p in pages for b in p["boxes"])
        splits[split] = {
            "pages": len(pages), "boxes": sum(classes.values()),
            "classes": {c: classes.get(c, 0) for c in CLASSES},
            "templates": dict(sorted(Counter(p["template"] for p in pages).items())),
            "fonts": dict(sorted(Counter(p["font"] for p in pages).items())),
            "scanned": sum(p["scanned"] for p in pages),
            "held_out_template_pages": sum(p["held_out_template"] for p in pages),
            "held_out_font_pages": sum(p["held_out_font"] for p in pages),
            "pages_per_second": rates.get(split),
        }
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {
        "kind": KIND, "format_version": FORMAT_VERSION, "classes": list(CLASSES), "splits": splits,
        "coco": {split: f"{split}.json" for split in SPLITS},
        "templates": [{"name": t.name, "columns": t.columns, "held_out": t.held_out} for t in TEMPLATES],
        "fonts": [f.describe() | {"held_out": f.id in held_out} for f in fonts["test"]],
        "settings": {k: v for k, v in to_dict(config).items() if k not in ("out", "workers")},
        "seeds": {"seed": config.seed, "page_generator": f"numpy default_rng([seed, split, index]), split in {list(SPLITS)}"},
        "held_out": "train never uses a held-out template or font; test draws from all of them (pages.jsonl "
                    "marks which) and its text comes from the corpora's held-out documents",
        "checksums": {str(p.relative_to(root)): file_sha256(p) for p in files},
        "versions": _versions(),
    }


def _versions() -> dict[str, str]:
    """What the pixels depend on besides the settings."""
    import matplotlib
    import PIL

    from sampan._version import __version__

    try:
        from importlib.metadata import version

        playwright = version("playwright")
    except Exception:  # noqa: BLE001 - a version string is informative only
        playwright = "unknown"
    return {"sampan": __version__, "pillow": PIL.__version__, "numpy": np.__version__,
            "matplotlib": matplotlib.__version__, "playwright": playwright}


def read_pages(root: str | Path, split: str) -> list[dict]:
    """The pages.jsonl records of ``split`` of a build."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    with (Path(root) / split / "pages.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]

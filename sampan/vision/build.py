"""``sampan data build-ocr``: the synthetic OCR data set, built in one seeded, reproducible pass.

Layout of the output directory (it appears complete or not at all)::

    manifest.json         counts, fonts (with SHA-256), charset checksum, settings, seeds, versions
    charset.txt           the recogniser's characters, one a line (sampan.vision.charset)
    train/lines.jsonl     one record per line image: text, quad, character quads, source, font, augmentations
    train/lines/000000.jpg ...
    train/pages.jsonl     one record per page image: each line's text and quadrilateral
    train/pages/000000.jpg ...
    test/...              the same, rendered only in the held-out fonts from the corpora's held-out documents

Each image is drawn from its own generator, ``numpy.random.default_rng([seed, split, kind, index])``,
so an image depends on nothing but the seed and its position: the same seed gives the same bytes with
any number of workers, and asking for more images leaves the first ones as they were.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sampan.utils.config import nested, resolve_nested, to_dict
from sampan.vision.augment import AugmentConfig, augment
from sampan.vision.charset import build_charset, category_counts, save_charset, unsupported

KIND = "sampan-ocr-data"
FORMAT_VERSION = 1
SPLITS = ("train", "test")
ITEMS = ("lines", "pages")
MANIFEST = "manifest.json"
CHARSET_FILE = "charset.txt"


@dataclasses.dataclass
class OcrDataConfig:
    """What ``sampan data build-ocr`` renders, and how.

    Fields:
        out: the output directory (replaced whole if it holds an earlier OCR build; any other
            non-empty directory is refused).
        train_lines: line images in the train split (for the CTC recogniser).
        test_lines: line images in the test split.
        train_pages: page images in the train split (for the DB detector).
        test_pages: page images in the test split.
        seed: the seed every image's generator is derived from.
        corpora: the corpora lines and pages are cut from (sampan.text.corpus: news, sanguo, reviews,
            poetry after `sampan data fetch poetry`, ...); their held-out documents feed the test split.
        fonts: the catalogue fonts to use (sampan.vision.fonts; empty: every installed one).
        held_out_fonts: the fonts rendered only into the test split (none: the catalogue's fixed
            choice, wqy-zenhei and noto-serif-cjk-sc).
        line_px: the font size range of line images, in pixels (low, high).
        max_line_chars: the longest line image, in characters.
        page_size: the page images' width and height before augmentation, in pixels.
        page_px: the body text's size range on pages, in pixels (headings are 1.2-1.8 times larger).
        block_rotate_prob: the chance that a page block (a heading or paragraph) is turned.
        max_block_rotate: a turned block's angle is uniform in [-max, max] degrees.
        line_format: the file format of line images.
        page_format: the file format of page images.
        file_quality: the JPEG quality files are saved at (the artefacts an augmentation adds come first).
        line_augment: degradations of line images.
        page_augment: degradations of page images.
        workers: processes rendering in parallel (the result does not depend on it; needs fork).
    """

    out: str
    train_lines: int = 4000
    test_lines: int = 500
    train_pages: int = 300
    test_pages: int = 50
    seed: int = 0
    corpora: tuple[str, ...] = ("news", "sanguo", "reviews")
    fonts: tuple[str, ...] = ()
    held_out_fonts: tuple[str, ...] | None = None
    line_px: tuple[int, int] = (16, 48)
    max_line_chars: int = 24
    page_size: tuple[int, int] = (768, 1024)
    page_px: tuple[int, int] = (14, 30)
    block_rotate_prob: float = 0.2
    max_block_rotate: float = 3.0
    line_format: Literal["png", "jpg"] = "jpg"
    page_format: Literal["png", "jpg"] = "jpg"
    file_quality: int = 92
    line_augment: AugmentConfig = nested(AugmentConfig)
    page_augment: AugmentConfig = nested(AugmentConfig, max_rotate_deg=3.0, max_perspective=0.05, lowres_prob=0.1,
                                         lowres_scale=(0.6, 0.9), max_blur=1.0, max_noise=10.0, jpeg_quality=(30, 90))
    workers: int = 1

    def __post_init__(self) -> None:
        resolve_nested(self)
        for name in ("train_lines", "test_lines", "train_pages", "test_pages"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not (self.train_lines or self.test_lines or self.train_pages or self.test_pages):
            raise ValueError("nothing to build: every count (--train-lines, --test-lines, --train-pages, "
                             "--test-pages) is 0")
        from sampan.text.corpus.registry import CORPORA

        unknown = [c for c in self.corpora if c not in CORPORA]
        if unknown:
            raise ValueError(f"unknown corpora {unknown}; known corpora: {', '.join(CORPORA)}")
        if not self.corpora:
            raise ValueError("--corpora is empty: lines and pages are cut from at least one corpus")
        for name, (low, high), bounds in (("line_px", self.line_px, (8, 200)), ("page_px", self.page_px, (8, 120))):
            if not bounds[0] <= low <= high <= bounds[1]:
                raise ValueError(f"--{name.replace('_', '-')} must be LOW,HIGH with {bounds[0]} <= LOW <= HIGH <= "
                                 f"{bounds[1]} pixels, got {low},{high}")
        if not 2 <= self.max_line_chars <= 200:
            raise ValueError(f"--max-line-chars must be in [2, 200], got {self.max_line_chars}")
        width, height = self.page_size
        if width < 10 * self.page_px[1] or height < 10 * self.page_px[1]:
            raise ValueError(f"--page-size {width},{height} is too small for text up to {self.page_px[1]} px: "
                             f"each side must be at least 10 times the largest --page-px ({10 * self.page_px[1]})")
        if not 0.0 <= self.block_rotate_prob <= 1.0 or not 0.0 <= self.max_block_rotate <= 20.0:
            raise ValueError("--block-rotate-prob must be in [0, 1] and --max-block-rotate in [0, 20] degrees")
        if not 50 <= self.file_quality <= 100:
            raise ValueError(f"--file-quality must be in [50, 100], got {self.file_quality}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")


# -- the per-process state every item reads -----------------------------------------------------------
@dataclasses.dataclass
class _State:
    config: OcrDataConfig
    out: Path
    fonts: dict[str, list]  # split -> [Font]
    sources: dict[str, Any]  # split -> TextSource
    allowed: dict[str, frozenset[str]]  # font id -> characters it may draw


_STATE: _State | None = None  # set before the work starts; forked workers inherit it


def _rng(seed: int, split: str, item: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, SPLITS.index(split), ITEMS.index(item), index])


def _save(image, path: Path, fmt: str, quality: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jpg":
        image.save(path, format="JPEG", quality=quality)
    else:
        image.save(path, format="PNG")


def _round(points: np.ndarray) -> list:
    return np.round(points, 2).tolist()


def _make_line(split: str, index: int) -> dict:
    from sampan.vision.render import render_line

    state = _STATE
    assert state is not None
    config = state.config
    rng = _rng(config.seed, split, "lines", index)
    fonts = state.fonts[split]
    font = fonts[int(rng.integers(len(fonts)))]
    sample = state.sources[split].line(rng, config.max_line_chars, state.allowed[font.id])
    size = int(rng.integers(config.line_px[0], config.line_px[1] + 1))
    line = render_line(sample.text, font, size, rng)
    points = np.concatenate([line.quad[None], line.char_quads])
    image, points, applied = augment(line.image, points, config.line_augment, rng, fill=tuple(line.params["bg"]))
    name = f"lines/{index:06d}.{config.line_format}"
    _save(image, state.out / split / name, config.line_format, config.file_quality)
    return {"id": f"{split}-line-{index:06d}", "image": name, "width": image.size[0], "height": image.size[1],
            "text": sample.text, "kind": sample.kind, "source": sample.source, "docs": list(sample.docs),
            "font": font.id, "size": size, "quad": _round(points[0]), "char_quads": _round(points[1:]),
            "render": {k: v for k, v in line.params.items() if k not in ("font", "size")}, "augment": applied}


def _make_page(split: str, index: int) -> dict:
    from sampan.vision.render import render_page

    state = _STATE
    assert state is not None
    config = state.config
    rng = _rng(config.seed, split, "pages", index)
    page = render_page(state.sources[split], state.fonts[split], state.allowed, rng, config.page_size, config.page_px,
                       config.max_block_rotate, config.block_rotate_prob)
    quads = np.stack([ln.quad for ln in page.lines]) if page.lines else np.zeros((0, 4, 2))
    desk = tuple(int(v) for v in rng.integers(0, 256, 3))  # what shows around a tilted page
    image, quads, applied = augment(page.image, quads, config.page_augment, rng, fill=desk)
    name = f"pages/{index:06d}.{config.page_format}"
    _save(image, state.out / split / name, config.page_format, config.file_quality)
    lines = [{"text": ln.text, "quad": _round(q), "font": ln.font, "size": ln.size, "docs": list(ln.docs)}
             for ln, q in zip(page.lines, quads, strict=True)]
    return {"id": f"{split}-page-{index:06d}", "image": name, "width": image.size[0], "height": image.size[1],
            "lines": lines, "layout": page.params, "augment": applied}


def _make(task: tuple[str, str, int]) -> dict:
    split, item, index = task
    return (_make_line if item == "lines" else _make_page)(split, index)


def _is_ocr_build(directory: Path) -> bool:
    try:
        return json.loads((directory / MANIFEST).read_text(encoding="utf-8")).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def _versions() -> dict[str, str]:
    """What the pixels depend on besides the settings: the same versions give the same bytes."""
    import PIL
    from PIL import features

    from sampan._version import __version__

    return {"sampan": __version__, "pillow": PIL.__version__, "numpy": np.__version__,
            "freetype": str(features.version("freetype2")), "libjpeg": str(features.version("jpg"))}


def build_ocr_data(config: OcrDataConfig, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Render the data set into ``config.out``; returns the manifest. Progress goes to ``log``."""
    global _STATE
    from sampan.text.corpus.registry import SPLIT_SEED
    from sampan.utils.atomic import atomic_dir
    from sampan.vision.fonts import select_fonts
    from sampan.vision.text_sources import TextSource, load_documents

    out = Path(config.out)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not _is_ocr_build(out))):
        raise FileExistsError(f"{out} exists and is not a data set built by `sampan data build-ocr`; "
                              "pick another --out (nothing was written)")
    start = time.perf_counter()
    fonts = select_fonts(config.fonts, config.held_out_fonts)  # fails first, before the corpora load
    docs = {split: load_documents(config.corpora, split) for split in SPLITS}
    chars = build_charset(t for split in SPLITS for items in docs[split].values() for _, t in items)
    charset = frozenset(chars)
    allowed = {f.id: charset & f.charset() for split in SPLITS for f in fonts[split]}
    sources = {split: TextSource(docs[split], split) for split in SPLITS}
    log(f"build-ocr: {len(chars):,} characters; fonts train {[f.id for f in fonts['train']]}, "
        f"test {[f.id for f in fonts['test']]}; corpora {list(config.corpora)} "
        f"({time.perf_counter() - start:.1f} s to load)")
    counts = {("train", "lines"): config.train_lines, ("test", "lines"): config.test_lines,
              ("train", "pages"): config.train_pages, ("test", "pages"): config.test_pages}
    records: dict[tuple[str, str], list[dict]] = {key: [] for key in counts}
    with atomic_dir(out) as tmp:
        _STATE = _State(config, tmp, fonts, sources, allowed)
        try:
            for (split, item), n in counts.items():
                if not n:
                    continue
                tasks = [(split, item, i) for i in range(n)]
                began, done = time.perf_counter(), 0
                for record in _run(tasks, config.workers):
                    records[split, item].append(record)
                    done += 1
                    if done == n or done % max(1, n // 10) == 0:
                        rate = done / max(1e-9, time.perf_counter() - began)
                        log(f"build-ocr: {split} {item} {done:,}/{n:,} ({rate:.1f}/s)")
        finally:
            _STATE = None
        for (split, item), rows in records.items():
            texts = [r["text"] for r in rows] if item == "lines" else [ln["text"] for r in rows for ln in r["lines"]]
            bad = [t for t in texts if unsupported(t, charset)]
            assert not bad, f"labels outside the charset: {bad[:3]}"  # the sampler draws only allowed characters
            (tmp / split).mkdir(parents=True, exist_ok=True)
            with (tmp / split / f"{item}.jsonl").open("w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        digest = save_charset(chars, tmp / CHARSET_FILE)
        manifest = _manifest(config, records, fonts, docs, chars, digest, SPLIT_SEED)
        (tmp / MANIFEST).write_text(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    log(f"build-ocr: wrote {out} in {time.perf_counter() - start:.1f} s")
    return manifest


def _run(tasks: list[tuple[str, str, int]], workers: int):
    """The records of ``tasks`` in order, rendered here or in ``workers`` forked processes."""
    if workers == 1 or len(tasks) < 2:
        yield from map(_make, tasks)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if "fork" not in multiprocessing.get_all_start_methods():
        print("build-ocr: no fork on this platform; rendering in one process", file=sys.stderr)
        yield from map(_make, tasks)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        yield from pool.map(_make, tasks, chunksize=8)


def _manifest(config: OcrDataConfig, records: dict, fonts: dict, docs: dict, chars: list[str], digest: str,
              split_seed: int) -> dict[str, Any]:
    splits = {}
    for split in SPLITS:
        lines, pages = records[split, "lines"], records[split, "pages"]
        page_lines = [ln for p in pages for ln in p["lines"]]
        used_docs = {d for r in lines for d in r["docs"]} | {d for ln in page_lines for d in ln["docs"]}
        splits[split] = {
            "lines": len(lines), "pages": len(pages), "page_lines": len(page_lines),
            "line_characters": sum(len(r["text"]) for r in lines),
            "page_characters": sum(len(ln["text"]) for ln in page_lines),
            "line_kinds": dict(sorted(Counter(r["kind"] for r in lines).items())),
            "line_fonts": dict(sorted(Counter(r["font"] for r in lines).items())),
            "documents_used": len(used_docs), "fonts": [f.id for f in fonts[split]],
            "augmented_lines": {k: sum(k in r["augment"] for r in lines)
                                for k in ("rotate", "perspective", "lowres", "blur", "noise", "jpeg")},
        }
    settings = {k: v for k, v in to_dict(config).items() if k not in ("out", "workers")}
    return {
        "kind": KIND, "format_version": FORMAT_VERSION, "splits": splits,
        "files": {split: {item: f"{split}/{item}.jsonl" for item in ITEMS} for split in SPLITS},
        "fonts": [f.describe() for split in SPLITS for f in fonts[split]],
        "charset": {"file": CHARSET_FILE, "sha256": digest, **category_counts(chars)},
        "corpora": {name: {split: len(docs[split][name]) for split in SPLITS} for name in config.corpora},
        "settings": settings,
        "seeds": {"seed": config.seed, "image_generator": "numpy default_rng([seed, split, item, index]) with "
                  f"split in {list(SPLITS)}, item in {list(ITEMS)}", "corpus_split_seed": split_seed},
        "held_out": "test images use only the held-out fonts, the corpora's held-out documents "
                    "(sampan.text.corpus fixed hash split) and the held-out Latin words",
        "versions": _versions(),
    }


def read_records(root: str | os.PathLike, split: str, item: str) -> list[dict]:
    """The label records of ``split``'s ``item`` ("lines" or "pages") of a build."""
    if split not in SPLITS or item not in ITEMS:
        raise ValueError(f"split must be one of {list(SPLITS)} and item one of {list(ITEMS)}")
    path = Path(root) / split / f"{item}.jsonl"
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]

"""A tiny OCR pair for the Taskflow / serving / browser tests: a rendered page (a heading over two
columns of two lines) and a DB detector + CTC recogniser of the configs' ``tiny()`` size that have
memorised it in a few seconds of training, saved in the ``model_io`` directory format.

Memorised, not learnt: the models only show that the pieces fit (export, predictor, crops, width
buckets, decoding, reading order); the trained ``ocr-det-zh`` / ``ocr-rec-zh`` are measured by
benchmarks/ocr.py. Built once per session into ``tmp_path_factory.getbasetemp() / "ocr_tiny"`` (the
same seed gives the same bytes, so each test file's Taskflow finds the first one's export in the
shared ``home`` cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

CHARSET = list("一二三四五六七八九十天地人")
# (text, x, y) on a 224 x 128 white page: a heading, then two columns of two lines
LINES = [("天地人一二三四五", 40, 6), ("一二三", 8, 44), ("四五六", 8, 84), ("七八九", 128, 44), ("十天地", 128, 84)]
PAGE_SIZE = (224, 128)
TEXT_PX = 18
READING_ORDER = ["天地人一二三四五", "一二三", "四五六", "七八九", "十天地"]  # heading, left column, right column


@dataclass
class TinyOCR:
    det: Path
    rec: Path
    home: Path
    page: np.ndarray
    quads: list[np.ndarray]

    def options(self) -> dict[str, str]:
        return {"det_model": str(self.det), "rec_model": str(self.rec)}


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width x height`` and whose data is a few bytes: a bomb's shape (or,
    with a 0, an empty image's)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")


def cjk_font():
    """The first installed CJK font; skips (a system package missing, which CI's no-skip rule turns
    into a failure) with the command that installs the fonts."""
    from sampan.vision import fonts

    installed = fonts.installed_fonts()
    if not installed:
        pytest.skip(f"no CJK font installed: {fonts.install_hint()}")
    return installed[0]


def render_page() -> tuple[np.ndarray, list[np.ndarray]]:
    """The page and each line's ink quadrilateral, in ``LINES`` order."""
    from sampan.vision.render import draw_text, ink_quad, pil_font

    font = cjk_font()
    pf = pil_font(font.path, font.index, TEXT_PX)
    mask = Image.new("L", PAGE_SIZE, 0)
    quads = [ink_quad(text, draw_text(mask, (x, y), text, pf)) for text, x, y in LINES]
    page = Image.new("RGB", PAGE_SIZE, (255, 255, 255))
    page.paste(Image.new("RGB", PAGE_SIZE, (0, 0, 0)), (0, 0), mask)
    return np.asarray(page), quads


def _train_detector(page: np.ndarray, quads: list[np.ndarray], out: Path) -> None:
    from sampan.vision.db_loss import DBLoss
    from sampan.vision.db_postprocess import DBPostProcessConfig
    from sampan.vision.db_targets import make_db_targets
    from sampan.vision.det_db import DBDetector, DBDetectorConfig

    config = DBDetectorConfig.tiny()
    config.postprocess = DBPostProcessConfig(box_thresh=0.3)  # an undertrained map is not near 1 inside
    model = DBDetector(config)
    batch, _, _ = model.preprocess(page)
    blank, _, _ = model.preprocess(np.full_like(page, 255))
    h, w = page.shape[:2]
    maps = [make_db_targets(quads, h, w, config.targets), make_db_targets([], h, w, config.targets)]
    targets = {k: torch.from_numpy(np.stack([m[k] for m in maps])) for k in maps[0]}
    loss_fn, optimizer = DBLoss(), torch.optim.Adam(model.parameters(), lr=3e-2)
    model.train()
    images = torch.cat([batch, blank])
    for _ in range(STEPS_DET):
        loss = loss_fn(model(images), targets)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(out)


def _train_recognizer(page: np.ndarray, quads: list[np.ndarray], det: Path, out: Path) -> None:
    from sampan.taskflow.ocr import DEFAULT_LINE_MARGIN, crop_line
    from sampan.vision import polygon as P
    from sampan.vision.det_db import DBDetector
    from sampan.vision.rec_ctc import CTCRecognizer, RecognizerConfig

    model = CTCRecognizer(RecognizerConfig.tiny(len(CHARSET) + 1), CHARSET)
    # the lines as labelled, and as the trained detector cuts them (its boxes are a pixel or two off)
    found = [b.quad for b in DBDetector.from_pretrained(det).detect(page)]
    pairs = [(q, text) for q, (text, _, _) in zip(quads, LINES, strict=True)]
    pairs += [(f, text) for f in found for q, (text, _, _) in zip(quads, LINES, strict=True) if P.convex_iou(f, q) > 0.5]
    batch, widths = model.prepare([crop_line(page, q, DEFAULT_LINE_MARGIN) for q, _ in pairs])
    texts = [text for _, text in pairs]
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(STEPS_REC):
        loss = model.loss(model(batch, widths), texts, widths)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(out)


STEPS_DET, STEPS_REC = 80, 200


def build_tiny_ocr(root: Path) -> TinyOCR:
    """Train (once: reused when ``root`` holds it) and save the pair; ``home`` is the $SAMPAN_HOME
    whose export cache the tests share."""
    page, quads = render_page()
    det, rec, home = root / "det", root / "rec", root / "home"
    if not (det / "model.safetensors").is_file() or not (rec / "model.safetensors").is_file():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            torch.manual_seed(0)
            _train_detector(page, quads, det)
            torch.manual_seed(0)
            _train_recognizer(page, quads, det, rec)
        finally:
            torch.set_num_threads(threads)
    home.mkdir(parents=True, exist_ok=True)
    return TinyOCR(det, rec, home, page, quads)

"""``ocr``: the text lines of an image, ``[{"text", "score", "box"}]`` in reading order.

::

    ocr = Taskflow("ocr")
    ocr("page.png")            # [{"text": "...", "score": 0.97, "box": [[x, y] x 4]}, ...]
    ocr([img1, img2])          # one list per image

Two stored models run through the inference predictor (ONNX Runtime by default), each exported
once on first use into the export cache (``$SAMPAN_HOME/cache/inference``) as the other tasks'
models are: the DB text detector (``ocr-det-zh``) finds line quadrilaterals; each quadrilateral is
cut out by a perspective warp into an upright line (one much taller than wide is read as a vertical
line, turned so it reads left to right); the lines are recognised by the CTC recogniser
(``ocr-rec-zh``) in batches of similar width (little padding); lines come back top to bottom, left
to right, a column at a time where the page has columns.

Images: a path, bytes, a PIL image or a numpy array (``sampan.vision.image_input``: bad files,
decompression bombs and odd pixel modes are handled there). An image without text gives ``[]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from sampan.taskflow.inputs import check_images
from sampan.taskflow.task import Task
from sampan.vision.image_input import ImageLimits

DET_MODEL, REC_MODEL = "ocr-det-zh", "ocr-rec-zh"
_EXPORT_VERSION = "ocr-1"  # bump when the exported signature changes, to invalidate old caches
# The page kept around a detected line, as a fraction of its height (see OCR's ``line_margin``).
DEFAULT_LINE_MARGIN = 0.25
_VERTICAL = 1.5  # a quad this many times taller than wide is a vertical line (PaddleOCR's rule)


@dataclass
class _Stage:
    """One exported OCR model: its directory, config and predictor."""

    directory: Path
    config: Any
    predictor: Any
    inference_dir: Path


def _model_dir(name: str, which: str) -> Path:
    """A store name or a model directory -> the directory; an unbuilt OCR model says how to build it."""
    from sampan.taskflow.inputs import model_directory

    option = "det_model" if which == "detection" else "rec_model"
    return model_directory(name, (DET_MODEL, REC_MODEL), (
        f"the OCR {which} model {{name!r}} is not built yet: build it with `sampan hub build {{name}}` (trains on "
        f"rendered text; see docs/ocr_models.md), or pass {option}=DIR naming a directory saved by save_pretrained"))


def _export(directory: Path, model_type: str) -> Path:
    """The cached inference directory of an OCR model directory, exporting it once
    (``sampan.taskflow.runtime.cached_export``)."""
    from sampan.taskflow.runtime import cached_export, files_digest
    from sampan.utils.paths import cache_dir

    target = cache_dir("inference", f"{directory.name}-{files_digest(directory, _EXPORT_VERSION)}")
    return cached_export(directory.name, target, lambda out: _export_into(directory, model_type, out))


def _export_into(directory: Path, model_type: str, target: Path) -> None:
    import torch

    from sampan.inference.export import export_model
    from sampan.static import InputSpec

    generator = torch.Generator().manual_seed(0)
    if model_type == "det":
        from sampan.vision.det_db import DBDetector

        model = DBDetector.from_pretrained(directory).float().eval()
        specs = [InputSpec([1, 3, None, None], "float32", "images")]
        examples = [torch.randn(1, 3, 64, 96, generator=generator)]
        names = ["prob"]
    else:
        from sampan.vision.rec_ctc import CTCRecognizer

        model = CTCRecognizer.from_pretrained(directory).float().eval()
        height = model.config.height
        specs = [InputSpec([None, 3, height, None], "float32", "images"), InputSpec([None], "int64", "widths")]
        examples = [torch.randn(2, 3, height, 64, generator=generator), torch.tensor([64, 40])]
        names = ["logits"]
    export_model(model, target, specs, overwrite=True, output_names=names, examples=examples)


class OCR(Task):
    """Text detection + recognition on images (see the module docstring).

    Options (besides every task's ``batch_size`` = lines per recognition batch, ``precision``,
    ``num_threads``, ``backend``, ``device``):
        det_model: the detector, a store name or a directory (default ``ocr-det-zh``; ``model=``
            names it too).
        rec_model: the recogniser, a store name or a directory (default ``ocr-rec-zh``).
        box_thresh: keep a detected box when the mean text probability inside reaches this
            (default: the detector's config, 0.6).
        drop_score: drop a line whose recognition score is below this (default 0.0: keep all
            non-empty lines).
        line_margin: how much page around each detected line the recogniser sees, as a fraction of
            the line's height on every side (default 0.25). The detector's boxes hug the ink, while
            ``ocr-rec-zh`` trained on line images with 0.05-0.5 of the font size around the text.
        max_pixels: refuse images with more pixels than this (default 50,000,000), before decoding.
        max_side: refuse images with a longer side than this (default 30,000).
    """

    name = "ocr"
    description = "text lines in an image (DB detection + CTC recognition): text, score and box, in reading order"
    default_model = DET_MODEL
    models = (DET_MODEL, REC_MODEL)
    option_names = ("det_model", "rec_model", "box_thresh", "drop_score", "line_margin", "max_pixels", "max_side")
    takes_images = True  # inputs are images, not texts (`sampan task ocr` reads its arguments as files)

    def _construct_model(self, model: str) -> None:
        from sampan.inference import Config, create_predictor
        from sampan.inference.device import predictor_device
        from sampan.taskflow.runtime import _default_threads
        from sampan.vision import model_io
        from sampan.vision.charset import load_charset
        from sampan.vision.det_db import MODEL_TYPE as DET_TYPE
        from sampan.vision.det_db import DBDetectorConfig
        from sampan.vision.rec_ctc import CHARSET_NAME, RecognizerConfig
        from sampan.vision.rec_ctc import MODEL_TYPE as REC_TYPE

        det_name = self.options.get("det_model")
        if det_name is not None and model not in (DET_MODEL, det_name):
            raise ValueError(f"model={model!r} and det_model={det_name!r} name two detectors; pass one")
        det_name = str(det_name or model)
        rec_name = str(self.options.get("rec_model") or REC_MODEL)
        self.model_name = det_name
        self.rec_model_name = rec_name
        self.limits = ImageLimits(**{k: self.options[k] for k in ("max_pixels", "max_side") if k in self.options})
        self.drop_score = float(self.options.get("drop_score", 0.0))
        if not 0.0 <= self.drop_score <= 1.0:
            raise ValueError(f"drop_score must be in [0, 1], got {self.drop_score}")
        self.line_margin = float(self.options.get("line_margin", DEFAULT_LINE_MARGIN))
        if not 0.0 <= self.line_margin <= 2.0:
            raise ValueError(f"line_margin must be in [0, 2] (a fraction of the line's height), got {self.line_margin}")
        predictor_device(self.device, self.backend)  # a GPU that cannot be used fails before the export

        det_dir, rec_dir = _model_dir(det_name, "detection"), _model_dir(rec_name, "recognition")
        det_config = model_io.load_config(DBDetectorConfig, DET_TYPE, det_dir)
        if "box_thresh" in self.options:
            import dataclasses

            det_config.postprocess = dataclasses.replace(det_config.postprocess,
                                                         box_thresh=float(self.options["box_thresh"]))
        rec_config = model_io.load_config(RecognizerConfig, REC_TYPE, rec_dir)
        if not (rec_dir / CHARSET_NAME).is_file():
            raise FileNotFoundError(f"{rec_dir} has no {CHARSET_NAME}: the recogniser cannot name what it reads; "
                                    "save it with CTCRecognizer(config, charset).save_pretrained(DIR)")
        self.charset = load_charset(rec_dir / CHARSET_NAME)
        if len(self.charset) + 1 != rec_config.num_classes:
            raise ValueError(f"{rec_dir}: {CHARSET_NAME} holds {len(self.charset)} characters but the model has "
                             f"{rec_config.num_classes} classes (characters + blank); the files do not belong together")

        def stage(directory: Path, config: Any, kind: str) -> _Stage:
            inference = _export(directory, kind)
            predictor = create_predictor(Config(str(inference), backend=self.backend, precision=self.precision,
                                                num_threads=self.num_threads or _default_threads(),
                                                device=self.device))
            return _Stage(directory, config, predictor, inference)

        self.det = stage(det_dir, det_config, "det")
        self.rec = stage(rec_dir, rec_config, "rec")

    # -- the loop: one image at a time through detection, then its lines in width buckets ---------
    def __call__(self, inputs: Any) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
        single, images = check_images(inputs, self.limits)
        results = [self.read(image) for image in images]
        return results[0] if single else results

    def read(self, image: np.ndarray) -> list[dict[str, Any]]:
        """The lines of one RGB ``uint8`` image (what ``__call__`` runs per image)."""
        boxes = self.detect(image)
        if not boxes:
            return []
        crops = [crop_line(image, box.quad, self.line_margin) for box in boxes]
        lines = []
        for box, (text, score) in zip(boxes, self.recognize(crops), strict=True):
            if text.strip() and score >= self.drop_score:
                lines.append({"text": text, "score": round(float(score), 4),
                              "box": [[round(float(x), 1), round(float(y), 1)] for x, y in box.quad]})
        return lines

    def detect(self, image: np.ndarray) -> list:
        """Text boxes (``TextBox``: quad + score) of one RGB image, in reading order."""
        from sampan.vision.db_postprocess import boxes_from_map

        cfg = self.det.config
        batch, scale = detector_input(image, cfg.limit_side, cfg.mean, cfg.std)
        (prob,) = self.det.predictor.run({"images": batch})
        boxes = boxes_from_map(prob[0, 0], cfg.postprocess, scale=scale, image_size=image.shape[:2])
        return reading_order(boxes)

    def recognize(self, crops: list[np.ndarray]) -> list[tuple[str, float]]:
        """``(text, score)`` per line image, batched by width (sorted, ``batch_size`` at a time)."""
        from sampan.vision.ctc_decode import greedy_decode

        cfg = self.rec.config
        resized = [resize_line(crop, cfg.height, cfg.max_width) for crop in crops]
        order = sorted(range(len(resized)), key=lambda i: resized[i].shape[1])
        out: list[tuple[str, float]] = [("", 0.0)] * len(crops)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            batch, widths = pad_lines([resized[i] for i in chunk])
            (logits,) = self.rec.predictor.run({"images": batch, "widths": widths})
            z = logits - logits.max(axis=-1, keepdims=True)
            probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
            frames = (widths + 3) // 4
            for i, result in zip(chunk, greedy_decode(probs, self.charset, frames), strict=True):
                out[i] = (result.text, result.score)
        return out

    def __repr__(self) -> str:
        return f"OCR(det_model={self.model_name!r}, rec_model={self.rec_model_name!r}, batch_size={self.batch_size})"


# -- pre- and post-processing (numpy / Pillow only: the models run in the predictor) -----------------
def detector_input(image: np.ndarray, limit_side: int, mean, std) -> tuple[np.ndarray, tuple[float, float]]:
    """``(batch of one, (sx, sy))``: the image resized so the longer side is at most ``limit_side`` and
    both sides are multiples of 32 (what the DB backbone needs), normalised, NCHW float32; ``s``
    maps map pixels back to image pixels (``DBDetector.preprocess`` on numpy)."""
    h, w = image.shape[:2]
    ratio = min(1.0, limit_side / max(w, h))
    nw, nh = (max(32, int(round(side * ratio / 32)) * 32) for side in (w, h))
    pixels = np.asarray(Image.fromarray(image).resize((nw, nh), Image.Resampling.BILINEAR), np.float32) / 255.0
    pixels = (pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))[None], (w / nw, h / nh)


def crop_line(image: np.ndarray, quad: np.ndarray, margin: float = 0.0) -> np.ndarray:
    """The quadrilateral ``quad`` (clockwise from the top left) cut out of ``image`` by a perspective
    warp into an upright rectangle, grown on every side by ``margin`` times the line's height (its
    shorter side); a line much taller than wide is turned a quarter counter-clockwise so that its
    top-to-bottom reading runs left to right."""
    from sampan.vision.geometry import perspective

    q = np.asarray(quad, np.float64)
    if margin > 0:
        q = grow_quad(q, margin)
    width = max(1, int(round(max(np.linalg.norm(q[1] - q[0]), np.linalg.norm(q[2] - q[3])))))
    height = max(1, int(round(max(np.linalg.norm(q[3] - q[0]), np.linalg.norm(q[2] - q[1])))))
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float64)
    inverse = perspective(target, q)  # output pixel -> source pixel, what Pillow's PERSPECTIVE takes
    inverse = inverse / inverse[2, 2]
    crop = Image.fromarray(image).transform((width, height), Image.Transform.PERSPECTIVE,
                                            tuple(inverse.flatten()[:8]), resample=Image.Resampling.BILINEAR,
                                            fillcolor=(255, 255, 255))
    if height >= _VERTICAL * width:
        crop = crop.transpose(Image.Transpose.ROTATE_90)
    return np.asarray(crop, np.uint8)


def grow_quad(quad: np.ndarray, margin: float) -> np.ndarray:
    """``quad`` moved outwards along its own two axes by ``margin`` times its shorter side on every side."""
    across = (quad[1] - quad[0] + quad[2] - quad[3]) / 2  # along the reading direction
    down = (quad[3] - quad[0] + quad[2] - quad[1]) / 2
    pad = margin * min(np.linalg.norm(across), np.linalg.norm(down))
    a = across / max(np.linalg.norm(across), 1e-9) * pad
    d = down / max(np.linalg.norm(down), 1e-9) * pad
    return quad + np.stack([-a - d, a - d, a + d, -a + d])


def resize_line(line: np.ndarray, height: int, max_width: int) -> np.ndarray:
    """A line image at the recogniser's ``height`` (aspect kept, width capped), scaled to [-1, 1],
    ``(3, height, width)`` (``CTCRecognizer.prepare``'s scaling)."""
    h, w = line.shape[:2]
    width = min(max_width, max(4, math.ceil(w * height / h)))
    pixels = np.asarray(Image.fromarray(line).resize((width, height), Image.Resampling.BILINEAR), np.float32)
    return ((pixels / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def pad_lines(lines: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad ``(3, H, w)`` lines with 0 to the widest (rounded up to 4): ``(batch, widths)``."""
    widths = np.array([line.shape[2] for line in lines], np.int64)
    width = int(-(-widths.max() // 4) * 4)
    batch = np.zeros((len(lines), 3, lines[0].shape[1], width), np.float32)
    for i, line in enumerate(lines):
        batch[i, :, :, : line.shape[2]] = line
    return batch, widths


def reading_order(boxes: list) -> list:
    """Top to bottom and left to right, one column at a time where the page has columns.

    Boxes wider than 60% of the text's extent (headings, full-width lines) cut the page into bands;
    within a band, the other boxes' horizontal extents are merged, and each gap between the merged
    extents is a gutter between columns (when each side holds at least two lines). Each column reads top to bottom (rows grouped as in
    ``db_postprocess.reading_order``) before the next one, left to right.
    """
    from sampan.vision.db_postprocess import reading_order as rows

    if len(boxes) < 2:
        return list(boxes)
    x0 = min(float(b.quad[:, 0].min()) for b in boxes)
    x1 = max(float(b.quad[:, 0].max()) for b in boxes)
    wide = [b for b in boxes if float(np.ptp(b.quad[:, 0])) > 0.6 * (x1 - x0)]
    ordered: list = []
    band: list = []

    def flush() -> None:
        for column in _columns(band):
            ordered.extend(rows(column))
        band.clear()

    for box in sorted(boxes, key=lambda b: float(b.quad[:, 1].min())):
        if any(box is w for w in wide):
            flush()
            ordered.append(box)
        else:
            band.append(box)
    flush()
    return ordered


def _columns(boxes: list) -> list[list]:
    """``boxes`` split at the gaps of their merged horizontal extents, left to right."""
    spans = sorted(((float(b.quad[:, 0].min()), float(b.quad[:, 0].max()), b) for b in boxes), key=lambda s: s[0])
    columns: list[list] = []
    right = -math.inf
    for left, end, box in spans:
        if not columns or left > right:
            columns.append([])
        columns[-1].append(box)
        right = max(right, end)
    # a lone box beside a column is a word on the same row (a label and its value), not a column
    return columns if all(len(c) >= 2 for c in columns) else [boxes]

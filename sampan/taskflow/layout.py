"""``layout``: the regions of a document page, ``[{"label", "score", "box"}]`` in reading order.

::

    layout = Taskflow("layout")
    layout("page.png")         # [{"label": "title", "score": 0.93, "box": [x0, y0, x1, y1]}, ...]
    layout([img1, img2])       # one list per image

The stored detector (``layout-det-zh``, built by ``sampan hub build layout-det-zh``; ``model=`` a
store name or a directory saved by ``Detector.save_pretrained``) is exported once on first use into
the export cache and run by the inference predictor (ONNX Runtime by default), as OCR's models are
(``sampan.taskflow.detector``). Labels are the model's class names: CDLA's ten for
``layout-det-zh`` (``sampan.vision.layout.classes``). Boxes are x0, y0, x1, y1 in the image's pixels.

Reading order (:func:`reading_order`): headers first and footers last; between them, regions wider
than 60% of the regions' extent (a title or table across the page) cut the page into bands, and
within a band the regions are read a column at a time, left to right, each top to bottom.

Images: a path, bytes, a PIL image or a numpy array (``sampan.vision.image_input``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sampan.taskflow.inputs import check_images, model_directory
from sampan.taskflow.task import Task
from sampan.vision.image_input import ImageLimits

LAYOUT_MODEL = "layout-det-zh"
WIDE = 0.6  # a region wider than this share of the regions' extent spans the columns


def model_dir(name: str) -> Path:
    """A store name or a model directory -> the directory; the unbuilt default says how to build it."""
    return model_directory(name, (LAYOUT_MODEL,), (
        "the layout model {name!r} is not built yet: build it with `sampan hub build {name}` (trains the detector "
        "on pages rendered by `sampan data build-layout`; see docs/layout.md), or pass model=DIR naming a "
        "directory saved by Detector.save_pretrained"))


class Layout(Task):
    """Document layout detection (see the module docstring).

    Options (besides every task's ``batch_size`` = images per predictor call, ``precision``,
    ``num_threads``, ``backend``, ``device``):
        score_threshold: keep a region whose class score reaches this (default 0.3).
        iou_threshold: NMS drops a region overlapping a better one of its class by more (default 0.6).
        max_pixels: refuse images with more pixels than this (default 50,000,000), before decoding.
        max_side: refuse images with a longer side than this (default 30,000).
    """

    name = "layout"
    description = "document layout regions of a page image (CDLA's 10 classes): label, score and box, in reading order"
    default_model = LAYOUT_MODEL
    models = (LAYOUT_MODEL,)
    option_names = ("score_threshold", "iou_threshold", "max_pixels", "max_side")
    takes_images = True  # inputs are images, not texts (`sampan task layout` reads its arguments as files)
    result_key = "regions"  # `sampan task layout` prints {"image": PATH, "regions": [...]} per image

    def _construct_model(self, model: str) -> None:
        from sampan.inference.device import predictor_device
        from sampan.taskflow.detector import DetectorPredictor

        self.limits = ImageLimits(**{k: self.options[k] for k in ("max_pixels", "max_side") if k in self.options})
        self.score_threshold = float(self.options.get("score_threshold", 0.3))
        self.iou_threshold = float(self.options.get("iou_threshold", 0.6))
        for key, value in (("score_threshold", self.score_threshold), ("iou_threshold", self.iou_threshold)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{key} must be in [0, 1], got {value}")
        predictor_device(self.device, self.backend)  # a GPU that cannot be used fails before the export
        self.directory = model_dir(str(model))
        self.detector = DetectorPredictor(self.directory, backend=self.backend, precision=self.precision,
                                          num_threads=self.num_threads, device=self.device)

    def __call__(self, inputs: Any) -> list[dict[str, Any]] | list[list[dict[str, Any]]]:
        single, images = check_images(inputs, self.limits)
        results = [self.regions(found) for found in self.detector.predict(
            images, self.score_threshold, self.iou_threshold, batch_size=self.batch_size)]
        return results[0] if single else results

    @staticmethod
    def regions(found: list[dict]) -> list[dict[str, Any]]:
        """The predictor's detections of one image as the task's dicts, in reading order."""
        out = [{"label": d["label"], "score": round(float(d["score"]), 4),
                "box": [round(float(v), 1) for v in d["box"]]} for d in found]
        return reading_order(out)

    def __repr__(self) -> str:
        return f"Layout(model={self.model_name!r}, score_threshold={self.score_threshold}, batch_size={self.batch_size})"


def reading_order(regions: list[dict]) -> list[dict]:
    """``regions`` (dicts with ``label`` and ``box`` x0,y0,x1,y1) in reading order: ``header`` regions
    first and ``footer`` regions last (each top to bottom, left to right); the rest cut into bands by
    the regions wider than 60% of their extent, each band read a column at a time (columns: the gaps
    between the merged horizontal extents of its regions), left to right, top to bottom within one."""
    head = sorted((r for r in regions if r["label"] == "header"), key=lambda r: (r["box"][1], r["box"][0]))
    foot = sorted((r for r in regions if r["label"] == "footer"), key=lambda r: (r["box"][1], r["box"][0]))
    body = [r for r in regions if r["label"] not in ("header", "footer")]
    if not body:
        return head + foot
    left = min(r["box"][0] for r in body)
    right = max(r["box"][2] for r in body)
    ordered: list[dict] = []
    band: list[dict] = []

    def flush() -> None:
        for column in _columns(band):
            ordered.extend(sorted(column, key=lambda r: (r["box"][1], r["box"][0])))
        band.clear()

    for region in sorted(body, key=lambda r: (r["box"][1], r["box"][0])):
        if region["box"][2] - region["box"][0] > WIDE * (right - left):
            flush()
            ordered.append(region)
        else:
            band.append(region)
    flush()
    return head + ordered + foot


def _columns(regions: list[dict]) -> list[list[dict]]:
    """``regions`` split at the gaps between their merged horizontal extents, left to right."""
    columns: list[list[dict]] = []
    edge = -math.inf
    for region in sorted(regions, key=lambda r: r["box"][0]):
        if not columns or region["box"][0] >= edge:
            columns.append([])
        columns[-1].append(region)
        edge = max(edge, region["box"][2])
    return columns

"""``document``: a page image as Markdown, ``{"markdown": ...}`` (layout + OCR + reading order).

::

    document = Taskflow("document")
    document("page.png")["markdown"]     # "# 标题\\n\\n正文……\\n\\n| 列 | 列 |\\n|---|---|\\n…"
    document([img1, img2])               # one dict per image

The page's layout regions (``Taskflow("layout")``'s detector, ``layout-det-zh``) and its text lines
(``Taskflow("ocr")``'s ``ocr-det-zh`` + ``ocr-rec-zh``) are found on the same decoded image, each
model through the inference predictor, and joined by
:func:`sampan.vision.document.page_to_markdown` (lines into regions, reading order, headings,
paragraphs, tables as Markdown tables, figures as placeholders with their captions).
``sampan task document page.png > page.md`` runs it from the shell.
"""

from __future__ import annotations

from typing import Any

from sampan.taskflow.inputs import check_images
from sampan.taskflow.layout import LAYOUT_MODEL
from sampan.taskflow.ocr import DET_MODEL, REC_MODEL
from sampan.taskflow.task import Task
from sampan.vision.image_input import ImageLimits


class Document(Task):
    """Document page to Markdown (see the module docstring).

    Options (besides every task's ``batch_size``, ``precision``, ``num_threads``, ``backend``,
    ``device``, which both models share):
        model: the layout detector, a store name or a directory (default ``layout-det-zh``).
        det_model, rec_model: OCR's text detector and recogniser (default ``ocr-det-zh``, ``ocr-rec-zh``).
        score_threshold: keep a layout region whose score reaches this (default 0.3).
        max_pixels, max_side: refuse larger images before decoding (defaults as OCR's).
    """

    name = "document"
    description = "a document page image as Markdown (layout regions + OCR lines, in reading order)"
    default_model = LAYOUT_MODEL
    models = (LAYOUT_MODEL, DET_MODEL, REC_MODEL)
    option_names = ("det_model", "rec_model", "score_threshold", "max_pixels", "max_side")
    takes_images = True
    prints_markdown = True  # `sampan task document page.png > page.md` writes the Markdown itself

    def _construct_model(self, model: str) -> None:
        from sampan.taskflow.layout import Layout
        from sampan.taskflow.ocr import OCR

        common = {"batch_size": self.batch_size, "precision": self.precision, "num_threads": self.num_threads,
                  "backend": self.backend, "device": self.device}
        limits = {k: self.options[k] for k in ("max_pixels", "max_side") if k in self.options}
        self.limits = ImageLimits(**limits)
        score = {"score_threshold": self.options["score_threshold"]} if "score_threshold" in self.options else {}
        self.layout = Layout(model=model, **common, **limits, **score)
        self.ocr = OCR(det_model=self.options.get("det_model") or DET_MODEL,
                       rec_model=self.options.get("rec_model") or REC_MODEL, **common, **limits)

    def __call__(self, inputs: Any) -> dict[str, str] | list[dict[str, str]]:
        single, images = check_images(inputs, self.limits)
        results = [self.page(image) for image in images]
        return results[0] if single else results

    def page(self, image) -> dict[str, str]:
        """``{"markdown": ...}`` of one RGB ``uint8`` image (what ``__call__`` runs per image)."""
        from sampan.vision.document import page_to_markdown

        (found,) = self.layout.detector.predict([image], self.layout.score_threshold, self.layout.iou_threshold)
        regions = self.layout.regions(found)
        lines = self.ocr.read(image)
        height, width = image.shape[:2]
        return {"markdown": page_to_markdown(regions, lines, width, height)}

    def __repr__(self) -> str:
        return f"Document(layout={self.layout!r}, ocr={self.ocr!r})"

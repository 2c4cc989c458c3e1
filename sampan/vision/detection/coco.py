"""COCO-format detection annotations: read, check (clear errors for bad files), evaluate mAP.

Accepted: ``{"images": [{"id", "file_name", "width", "height"}], "annotations": [{"id", "image_id",
"category_id", "bbox": [x, y, w, h]}], "categories": [{"id", "name"}]}``; image paths are relative
to the JSON file's folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


class CocoFormatError(ValueError):
    """A COCO annotation file that cannot be trained on; the message names the entry and the fix."""


@dataclass
class CocoImage:
    """One image: its path, size, and boxes as x0,y0,x1,y1 with contiguous class indices."""

    id: int
    path: Path
    width: int
    height: int
    boxes: list[list[float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)


@dataclass
class CocoDataset:
    """A checked COCO file: ``class_names[i]`` is class index ``i``; ``category_ids[i]`` its COCO id."""

    path: Path
    images: list[CocoImage]
    class_names: list[str]
    category_ids: list[int]


def read_coco(path: str | Path, check_files: bool = True) -> CocoDataset:
    """Read and validate a COCO detection file; raise :class:`CocoFormatError` on any bad entry."""
    path = Path(path)
    if not path.is_file():
        raise CocoFormatError(f"{path}: no such COCO annotation file; pass the path of a .json file")
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise CocoFormatError(f"{path}: the file is empty; it must hold a COCO JSON object with "
                              "'images', 'annotations' and 'categories'")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise CocoFormatError(f"{path}: not valid JSON ({err})") from err
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise CocoFormatError(f"{path}: missing the list '{key}' a COCO detection file needs")
    if not data["images"]:
        raise CocoFormatError(f"{path}: 'images' is empty; list at least one image")
    if not data["annotations"]:
        raise CocoFormatError(f"{path}: 'annotations' is empty; a detector needs at least one labelled box")
    if not data["categories"]:
        raise CocoFormatError(f"{path}: 'categories' is empty; list the classes as {{'id', 'name'}}")
    categories = sorted(data["categories"], key=lambda c: c["id"])
    index_of = {c["id"]: i for i, c in enumerate(categories)}
    images: dict[int, CocoImage] = {}
    for im in data["images"]:
        image = CocoImage(int(im["id"]), path.parent / im["file_name"], int(im["width"]), int(im["height"]))
        if check_files and not image.path.is_file():
            raise CocoFormatError(f"{path}: image {image.id} file {image.path} does not exist; "
                                  "file_name is relative to the annotation file's folder")
        images[image.id] = image
    for ann in data["annotations"]:
        aid, iid = ann.get("id"), ann.get("image_id")
        if iid not in images:
            raise CocoFormatError(f"{path}: annotation {aid} refers to image_id {iid}, which is not in 'images'")
        if ann.get("category_id") not in index_of:
            raise CocoFormatError(f"{path}: annotation {aid} (image {iid}) has unknown category_id "
                                  f"{ann.get('category_id')}; known ids are {sorted(index_of)}")
        image = images[iid]
        x, y, w, h = (float(v) for v in ann["bbox"])
        if w <= 0 or h <= 0:
            raise CocoFormatError(f"{path}: annotation {aid} (image {iid}) has non-positive box size "
                                  f"w={w}, h={h}; bbox is [x, y, width, height]")
        if x < 0 or y < 0 or x + w > image.width + 0.5 or y + h > image.height + 0.5:
            raise CocoFormatError(f"{path}: annotation {aid} box {[x, y, w, h]} lies outside image {iid} "
                                  f"({image.width}x{image.height}); clip it to the image or fix width/height")
        image.boxes.append([x, y, x + w, y + h])
        image.labels.append(index_of[ann["category_id"]])
    return CocoDataset(path, list(images.values()), [c["name"] for c in categories], [c["id"] for c in categories])


def coco_detection(image_id: int, category_id: int, box, score: float) -> dict:
    """One detection as COCO results take it: ``box`` ``[x0, y0, x1, y1]`` (what sampan's detectors
    return) becomes ``bbox`` ``[x, y, width, height]``."""
    x0, y0, x1, y1 = (float(v) for v in box)
    return {"image_id": image_id, "category_id": category_id, "bbox": [x0, y0, x1 - x0, y1 - y0], "score": float(score)}


def evaluate_coco_map(ground_truth: str | Path | dict, detections: list[dict]) -> dict[str, float]:
    """mAP through pycocotools' COCOeval against a COCO file or its loaded dict. ``detections``: ``{"image_id", "category_id", "bbox"
    [x, y, w, h], "score"}``. Returns ``map`` (0.5:0.95), ``map50`` and ``ap/<class name>``."""
    import contextlib
    import io

    import numpy as np
    from pycocotools.coco import COCO  # lazy: only evaluation needs it
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        if isinstance(ground_truth, dict):
            gt = COCO()
            gt.dataset = ground_truth
            gt.createIndex()
        else:
            gt = COCO(str(ground_truth))
        if not detections:
            return {"map": 0.0, "map50": 0.0}
        dt = gt.loadRes(detections)
        ev = COCOeval(gt, dt, "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    out = {"map": float(max(ev.stats[0], 0.0)), "map50": float(max(ev.stats[1], 0.0))}
    precision = ev.eval["precision"]  # (iou, recall, class, area, maxdets)
    for k, cat_id in enumerate(ev.params.catIds):
        p = precision[:, :, k, 0, -1]
        p = p[p > -1]
        out[f"ap/{gt.cats[cat_id]['name']}"] = float(np.mean(p)) if p.size else 0.0
    return out

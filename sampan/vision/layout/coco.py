"""The COCO detection file of a split: images, annotations (``bbox`` ``[x, y, w, h]`` in pixels,
``area`` = w * h, ``iscrowd`` 0) and the ten CDLA categories."""

from __future__ import annotations

from sampan.vision.layout.classes import CATEGORY_IDS, coco_categories


def coco_file(pages: list[dict], description: str) -> dict:
    """The COCO dict of ``pages`` (pages.jsonl records, each with ``image``, ``width``, ``height`` and
    ``boxes`` ``[{"class", "bbox": [x0, y0, x1, y1]}]``); image ids are 1-based in page order."""
    images, annotations = [], []
    for image_id, page in enumerate(pages, start=1):
        images.append({"id": image_id, "file_name": page["image"], "width": page["width"], "height": page["height"],
                       "page": page["id"]})
        for box in page["boxes"]:
            x0, y0, x1, y1 = box["bbox"]
            w, h = round(x1 - x0, 2), round(y1 - y0, 2)
            annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                                "category_id": CATEGORY_IDS[box["class"]], "bbox": [round(x0, 2), round(y0, 2), w, h],
                                "area": round(w * h, 2), "iscrowd": 0, "block": box["block"]})
    return {"info": {"description": description, "version": "1"}, "images": images,
            "annotations": annotations, "categories": coco_categories()}

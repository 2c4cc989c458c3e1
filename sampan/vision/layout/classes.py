"""CDLA's ten document-layout classes, in CDLA's order: the one definition the data engine, the
detector's label maps and the evaluation import.

A class's COCO category id is its index + 1 (COCO ids start at 1; 0 is left for "background").
"""

from __future__ import annotations

CLASSES: tuple[str, ...] = ("text", "title", "figure", "figure_caption", "table", "table_caption", "header",
                            "footer", "reference", "equation")
CATEGORY_IDS: dict[str, int] = {name: i + 1 for i, name in enumerate(CLASSES)}


def coco_categories() -> list[dict]:
    """The ``categories`` list of a COCO file holding these classes."""
    return [{"id": CATEGORY_IDS[name], "name": name, "supercategory": "layout"} for name in CLASSES]


def check_class(name: str) -> str:
    """``name`` if it is one of the ten classes, else a ValueError that lists them."""
    if name not in CATEGORY_IDS:
        raise ValueError(f"unknown layout class {name!r}; the classes are {', '.join(CLASSES)}")
    return name

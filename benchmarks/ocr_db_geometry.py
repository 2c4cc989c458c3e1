"""DB geometry on rendered Chinese pages: how well do the shrink (targets) and the unclip
(post-processing) undo each other, side by side for sampan's exact inverse and PaddleOCR's fixed
unclip ratio 1.5, at two shrink ratios and two text sizes?

Each page comes from the OCR data engine (``sampan.vision.render.render_page``, half of its blocks
turned up to 6 degrees). Its line quadrilaterals become DB targets (``make_db_targets``); the shrink
map itself, scaled to 0.9, is post-processed as if it were a perfect model's probability map, and
every labelled line is matched to its best box by IoU. This measures the geometry only: a trained
model's map is blurrier than its target, which widens its regions (PaddleOCR's ratio may be tuned
for that), so the winner for a trained model has to be measured on one.

Run:  python benchmarks/ocr_db_geometry.py            (6 pages per setting, ~1 min on 2 cores)
      python benchmarks/ocr_db_geometry.py --quick    (1 page per setting)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info, timestamp, write_json_atomic  # noqa: E402
from sampan.vision import fonts as font_catalogue  # noqa: E402
from sampan.vision import polygon as P  # noqa: E402
from sampan.vision.db_postprocess import DBPostProcessConfig, boxes_from_map  # noqa: E402
from sampan.vision.db_targets import DBTargetConfig, make_db_targets  # noqa: E402
from sampan.vision.render import render_page  # noqa: E402
from sampan.vision.text_sources import TextSource  # noqa: E402

# A small in-memory text (no corpus loading): the layout, not the words, is what is measured.
TEXT = {"sanguo": [(f"doc-{i}", "天下大势，分久必合，合久必分。周末七国分争，并入于秦。及秦灭之后，楚、汉分争，又并入于汉。"
                    "汉朝自高祖斩白蛇而起义，一统天下，后来光武中兴，传至献帝，遂分为三国。" * 3) for i in range(4)]}
PAGE = (400, 520)
WHITE_PAGE = ((255, 255, 255), (0, 0, 0), "flat")


def measure(pages: int, text_px: tuple[int, int], shrink_ratio: float, unclip_ratio: float | None) -> dict:
    fonts = font_catalogue.select_fonts()["train"]
    allowed = {f.id: f.charset() for f in fonts}
    ious, boxes_found, lines = [], 0, 0
    for seed in range(pages):
        rng = np.random.default_rng(seed)
        page = render_page(TextSource(TEXT, "train", {"corpus": 1.0}), fonts, allowed, rng, PAGE, text_px,
                           max_block_rotate=6.0, block_rotate_prob=0.5, style=WHITE_PAGE)
        quads = [ln.quad for ln in page.lines]
        targets = make_db_targets(quads, PAGE[1], PAGE[0], DBTargetConfig(shrink_ratio=shrink_ratio))
        boxes = boxes_from_map(targets["shrink_map"] * 0.9,
                               DBPostProcessConfig(shrink_ratio=shrink_ratio, unclip_ratio=unclip_ratio))
        boxes_found += len(boxes)
        lines += len(quads)
        ious += [max((P.convex_iou(q, b.quad) for b in boxes), default=0.0) for q in quads]
    a = np.array(ious)
    return {"text_px": list(text_px), "shrink_ratio": shrink_ratio,
            "unclip": "inverse" if unclip_ratio is None else unclip_ratio, "pages": pages, "lines": lines,
            "boxes": boxes_found, "median_iou": round(float(np.median(a)), 4),
            "share_iou_over_0.5": round(float((a > 0.5).mean()), 4),
            "share_iou_over_0.7": round(float((a > 0.7).mean()), 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=6, help="pages per setting")
    parser.add_argument("--quick", action="store_true", help="one page per setting")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "ocr_db_geometry.json"),
                        help="where the JSON results go")
    args = parser.parse_args(argv)
    pages = 1 if args.quick else args.pages
    rows = [measure(pages, px, r, u) for px in ((14, 18), (24, 32)) for r in (0.4, 0.6) for u in (None, 1.5)]
    print(f"{'text px':>8} {'r':>4} {'unclip':>8} {'lines':>6} {'boxes':>6} {'median IoU':>11} {'IoU>0.5':>8} "
          f"{'IoU>0.7':>8}")
    for row in rows:
        print(f"{'-'.join(map(str, row['text_px'])):>8} {row['shrink_ratio']:>4} {str(row['unclip']):>8} "
              f"{row['lines']:>6} {row['boxes']:>6} {row['median_iou']:>11.3f} {row['share_iou_over_0.5']:>8.3f} "
              f"{row['share_iou_over_0.7']:>8.3f}")
    write_json_atomic(args.out, {"benchmark": "ocr_db_geometry", "timestamp": timestamp(), "machine": machine_info(),
                                 "page_size": list(PAGE), "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

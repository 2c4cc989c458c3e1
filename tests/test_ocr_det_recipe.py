"""The ``ocr-det-zh`` recipe on a tiny setting: it writes a loadable fp16 detector whose card holds
the held-out figures, and a rerun after the last checkpoint is lost resumes from the one before and
ends on the same weights, bit for bit. Measured cost: ~10 s of CPU on this 2-core machine (four
320 x 320 pages rendered once, two 6-step builds of a 24K-parameter detector; 40 s wall while other
jobs loaded both cores)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from sampan.hub import recipes
from sampan.vision.det_db import DBDetector
from sampan.vision.train_det import matches, prf

TINY = ["data.train_pages=2", "data.test_pages=2", "data.page_size=320,320", "data.page_px=14,20", "dev_pages=1",
        "stem_channels=8", "stage_channels=16,24,32,48", "stage_blocks=1,1,1,1", "neck_channels=32",
        "crop.size=128", "crop.crops_per_page=4", "training.max_steps=6", "training.per_device_train_batch_size=2",
        "training.warmup_steps=2", "training.save_steps=3", "training.logging_steps=3", "training.eval_steps=3"]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    return tmp_path


def test_tiny_recipe_writes_a_detector_with_its_figures_and_resumes(home):
    lines: list[str] = []
    target = recipes.build("ocr-det-zh", TINY, log=lines.append, out_root=home / "models")
    card = json.loads((target / "card.json").read_text(encoding="utf-8"))
    metrics = card["metrics"]
    assert card["task"] == "ocr_detection" and card["settings"]["training"]["max_steps"] == 6
    assert metrics["unclip"] in ("inverse", "1.5") and metrics["test_pages"] == 1 and metrics["test_lines"] > 0
    assert metrics["trained_steps"] in (3, 6) and metrics["parameters"] == 23938
    other = "1.5" if metrics["unclip"] == "inverse" else "inverse"
    for key in ("test_precision", "test_recall", "test_f1", "test_f1_iou70", "test_mean_iou", "dev_f1",
                f"test_f1_unclip_{other}", f"test_f1_iou70_unclip_{other}", f"dev_mean_iou_unclip_{other}"):
        assert 0.0 <= metrics[key] <= 1.0, key
    weights = load_file(str(target / "model.safetensors"))
    assert all(v.dtype == torch.float16 for v in weights.values() if v.is_floating_point())
    model = DBDetector.from_pretrained(target)  # fp16 on disk, fp32 once loaded
    assert model.config.postprocess.unclip_ratio == (None if metrics["unclip"] == "inverse" else 1.5)
    page = next((home / "build").glob("ocr-det-pages-*/test/pages/000001.jpg"))
    assert isinstance(model.detect(Image.open(page)), list)

    run = home / "build" / "ocr-det-zh"
    checkpoints = sorted(run.glob("checkpoint-*"))
    assert len(checkpoints) == 2
    assert [json.loads(x)["step"] for x in (run / "dev_eval.jsonl").read_text().splitlines()] == [3, 6]
    first = load_file(str(checkpoints[-1] / "model.safetensors"))
    shutil.rmtree(checkpoints[-1])  # lost: the same command resumes from step 3
    lines.clear()
    recipes.build("ocr-det-zh", TINY, log=lines.append, out_root=home / "models")
    again = load_file(str(checkpoints[-1] / "model.safetensors"))
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)
    steps = [json.loads(x)["step"] for x in (run / "dev_eval.jsonl").read_text().splitlines()]
    assert steps == [3, 6, 6]  # the resumed run scored only step 6


def test_matching_is_one_to_one_at_the_iou():
    box = [[0, 0], [100, 0], [100, 20], [0, 20]]
    shifted = [[30, 0], [130, 0], [130, 20], [30, 20]]  # IoU 70 / 130 = 0.54 with box
    assert matches([box, box], [box], 0.5) == [1.0]  # a duplicate box does not match twice
    assert matches([shifted], [box], 0.5) == [1400 / 2600] and matches([shifted], [box], 0.6) == []
    assert prf(1, 2, 1) == {"precision": 0.5, "recall": 1.0, "f1": 2 / 3}
    assert prf(0, 0, 3) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}

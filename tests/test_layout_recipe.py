"""The ``layout-det-zh`` recipe at tiny settings: it renders its pages (real headless Chromium, cached),
trains the detector through sampan's Trainer, scores COCO mAP on the held-out test pages, stores an
fp16 model with its card, and a rerun whose last checkpoint is gone resumes from the one before and
stores the same weights (seeded; the colour jitter is drawn from the sample's index).

The figures of tiny settings mean nothing (a 7.7K-parameter net, 4 steps); the full build's are in
its card. Cost: ~15 s of CPU (3 + 2 pages rendered, 4 + 2 steps at 128 px, 2 evaluations), more
wall-clock on busy cores; the settings checks < 1 s.
"""

from __future__ import annotations

import json
import shutil

import pytest

from sampan.utils.config import build as build_config
from sampan.vision.layout_recipe import LayoutDetRecipe

TINY = {"data": {"train_pages": 3, "test_pages": 2, "corpora": ["sanguo", "reviews"]}, "input_size": 128,
        "stem_channels": 8, "stage_channels": [8, 16, 24, 32], "stage_blocks": [1, 1, 1, 1], "width": 16,
        "training": {"max_steps": 4, "per_device_train_batch_size": 2, "save_steps": 2, "logging_steps": 1,
                     "warmup_steps": 1}}


@pytest.mark.parametrize("change, words", [
    ({"input_size": 100}, "multiple of 32"),
    ({"data": {"out": "/tmp/x"}}, "data.out is set by the recipe"),
    ({"training": {"output_dir": "/tmp/x"}}, "training.output_dir is set by the recipe"),
    ({"data": {"train_pages": 4}}, "at least one batch"),
    ({"data": {"test_pages": 0}}, "held-out pages"),
])
def test_settings_refuse_what_cannot_work(change, words):
    with pytest.raises(ValueError, match=words):
        build_config(LayoutDetRecipe, change)
    assert LayoutDetRecipe().detector_config().class_names[:2] == ("text", "title")


@pytest.mark.slow
@pytest.mark.browser
def test_tiny_build_scores_stores_fp16_and_resumes(tmp_path, monkeypatch, capsys):
    from safetensors.torch import load_file

    from sampan.hub.recipes import build
    from sampan.vision.detection.model import Detector
    from sampan.vision.layout.classes import CLASSES

    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    settings = build_config(LayoutDetRecipe, TINY)
    logs: list[str] = []
    out = build("layout-det-zh", settings=settings, out_root=tmp_path / "models", log=logs.append)
    card = json.loads((out / "card.json").read_text(encoding="utf-8"))
    metrics = card["metrics"]
    assert card["task"] == "layout" and card["settings"]["input_size"] == 128
    assert metrics["trained_steps"] == 4 and metrics["test_pages"] == 2
    assert 0.0 <= metrics["test_map"] <= metrics["test_map50"] <= 1.0 and metrics["seconds_per_page"] > 0
    weights = load_file(str(out / "model.safetensors"))
    assert {str(t.dtype) for t in weights.values() if t.is_floating_point()} == {"torch.float16"}
    assert Detector.from_pretrained(out).config.class_names == CLASSES
    assert (out / "model.safetensors").stat().st_size < 100_000

    (run,) = (tmp_path / "home" / "build").glob("layout-det-zh-*")
    shutil.rmtree(max(run.glob("checkpoint-*")))  # the sitting "stopped" after step 2
    capsys.readouterr()
    again = build("layout-det-zh", settings=settings, out_root=tmp_path / "again", log=logs.append)
    assert "at step 2" in capsys.readouterr().out  # the Trainer's "resumed from ... at step 2"
    assert any("reusing pages" in line for line in logs)
    resumed = load_file(str(again / "model.safetensors"))
    assert all(bool((resumed[k] == weights[k]).all()) for k in weights)

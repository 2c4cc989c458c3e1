"""The detector exported through ``jit.save`` and run by the inference predictor gives the boxes the
eager ``Detector.predict`` gives, on images of other shapes than its square input (letterbox and the
way back to image pixels included), from a directory stored in fp16 as the hub stores it; the export
is made once and reused from the cache.

Cost: ~10 s on 2 busy cores, nearly all of it the one export.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image


@pytest.mark.slow  # one torch.export + ONNX export (~7 s)
def test_predictor_boxes_equal_eager_predict(tmp_path, monkeypatch):
    from sampan.taskflow.detector import DetectorPredictor, export_detector
    from sampan.vision.backbone import BackboneConfig
    from sampan.vision.detection.model import Detector, DetectorConfig

    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    torch.manual_seed(0)
    model = Detector(DetectorConfig(num_classes=3, class_names=("text", "title", "figure"),
                                    backbone=BackboneConfig(stem_channels=8, stage_channels=(8, 16, 24, 32),
                                                            stage_blocks=(1, 1, 1, 1)), width=16, input_size=64))
    with torch.no_grad():  # untrained scores sit near 0.5 (not at the 0.01 prior), so there is something to find
        model.cls.bias.copy_(torch.tensor([0.3, 0.0, -0.3]))
    model.half().save_pretrained(tmp_path / "det")  # the store's fp16
    eager = Detector.from_pretrained(tmp_path / "det")

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((50, 90), (120, 40))]
    predictor = DetectorPredictor(tmp_path / "det")
    assert (predictor.inference_dir / "inference.onnx").is_file() and (predictor.inference_dir / "inference.pt2").is_file()
    got = predictor.predict([images[0], np.asarray(images[1])], score_threshold=0.45, iou_threshold=0.9)
    for image, found in zip(images, got, strict=True):
        want = eager.predict(image, score_threshold=0.45, iou_threshold=0.9)
        assert len(want) >= 3 and len(found) == len(want)
        assert [d["label"] for d in found] == [d["label"] for d in want]
        np.testing.assert_allclose([d["box"] for d in found], [d["box"] for d in want], atol=1e-3)
        np.testing.assert_allclose([d["score"] for d in found], [d["score"] for d in want], atol=1e-5)
        for d in found:  # in the image's own pixels, not the 64 x 64 input's
            x0, y0, x1, y1 = d["box"]
            assert 0 <= x0 <= x1 <= image.width and 0 <= y0 <= y1 <= image.height
    assert max(d["box"][3] for d in got[1]) > 64  # the tall image's boxes reach below the input's side
    # the export is cached: a second predictor finds it
    assert export_detector(tmp_path / "det") == predictor.inference_dir

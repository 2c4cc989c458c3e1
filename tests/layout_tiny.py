"""A tiny untrained layout detector (CDLA's ten classes) saved as the store saves one, for the tests
that need a ``Taskflow("layout")`` / ``"document"`` model without training one."""

from __future__ import annotations

from pathlib import Path


def build_tiny_detector(path: Path) -> Path:
    """Save a seeded 64 px detector to ``path`` (fp16, ``Detector.save_pretrained``) and return it.
    Its class biases are raised from the 0.01 prior to ~0.5, so the untrained net finds regions."""
    import torch

    from sampan.vision.backbone import BackboneConfig
    from sampan.vision.detection.model import Detector, DetectorConfig
    from sampan.vision.layout.classes import CLASSES

    torch.manual_seed(0)
    model = Detector(DetectorConfig(num_classes=len(CLASSES), class_names=CLASSES, input_size=64, width=16,
                                    backbone=BackboneConfig(stem_channels=8, stage_channels=(8, 16, 24, 32),
                                                            stage_blocks=(1, 1, 1, 1))))
    with torch.no_grad():
        model.cls.bias.copy_(torch.linspace(0.4, -0.4, len(CLASSES)))
    model.half().save_pretrained(path)
    return path

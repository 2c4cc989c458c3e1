"""The ``layout-det-zh`` recipe's settings (the code is :mod:`sampan.vision.detection.train`),
torch-free so that ``sampan hub build --help`` lists them without importing torch."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from sampan.trainer.arguments import TrainingArguments
from sampan.utils.config import nested, refuse_changes, resolve_nested
from sampan.vision.layout.build import LayoutDataConfig


@dataclasses.dataclass
class LayoutDetRecipe:
    """layout-det-zh: the PicoDet-like detector (LCNet + FPN + shared GFL head) trained on the Chinese
    document pages of ``sampan data build-layout``, in CDLA's ten classes.

    Fields:
        data: the page set (``sampan data build-layout``), rendered once and reused; its test pages
            (held-out templates, fonts and documents) give the reported mAP.
        stem_channels: channels of the LCNet backbone's first convolution.
        stage_channels: output channels of the backbone's four stages.
        stage_blocks: depthwise-separable blocks in each stage.
        width: channels of the FPN neck and the shared head.
        reg_max: DFL bins per box side.
        input_size: the square side pages are letterboxed to (a multiple of 32): a 800 x 1131 page
            at 640 keeps a body-text line about 8 pixels tall.
        colour_jitter: brightness / contrast jitter drawn per training sample (pages are not flipped:
            a mirrored page is not a page).
        training: the Trainer's arguments (seeded; a rerun of the same build resumes from the newest
            checkpoint in $SAMPAN_HOME/build/layout-det-zh-<digest>).
        score_threshold: the lowest score kept when scoring mAP (COCO's practice: low, so the
            precision-recall curve is whole).
    """

    RENAMED: ClassVar[dict[str, str]] = {"steps": "training.max_steps", "seed": "training.seed",
                                         "batch_size": "training.per_device_train_batch_size",
                                         "learning_rate": "training.learning_rate"}
    OWNED: ClassVar[dict[str, str]] = {
        "data.out": "set by the recipe ($SAMPAN_HOME/build/layout-pages-<digest>)",
        "training.output_dir": "set by the recipe ($SAMPAN_HOME/build/layout-det-zh-<digest>)"}

    data: LayoutDataConfig = nested(LayoutDataConfig, out="", train_pages=1000, test_pages=100)
    stem_channels: int = 16
    stage_channels: tuple[int, int, int, int] = (32, 64, 128, 192)
    stage_blocks: tuple[int, int, int, int] = (1, 2, 2, 2)
    width: int = 96
    reg_max: int = 7
    input_size: int = 640
    colour_jitter: float = 0.2
    training: TrainingArguments = nested(
        TrainingArguments, max_steps=6000, per_device_train_batch_size=8, learning_rate=4e-3,
        lr_scheduler="cosine", warmup_steps=300, min_lr_ratio=0.05, weight_decay=1e-4, max_grad_norm=5.0, seed=0,
        logging_steps=20, save_steps=300, save_total_limit=2, resume_from_checkpoint="auto",
        overwrite_output_dir=True, tensorboard=False, progress_bar=False)
    score_threshold: float = 0.05

    def __post_init__(self) -> None:
        resolve_nested(self)
        refuse_changes(self)
        if self.input_size < 64 or self.input_size % 32:
            raise ValueError(f"input_size must be a multiple of 32 and >= 64, got {self.input_size}")
        if self.width < 1 or self.stem_channels < 1:
            raise ValueError(f"width and stem_channels must be >= 1, got {self.width} and {self.stem_channels}")
        if not 0.0 <= self.colour_jitter < 1.0:
            raise ValueError(f"colour_jitter must be in [0, 1), got {self.colour_jitter}")
        if not 0.0 <= self.score_threshold < 1.0:
            raise ValueError(f"score_threshold must be in [0, 1), got {self.score_threshold}")
        if self.data.train_pages < self.training.per_device_train_batch_size:
            raise ValueError(f"data.train_pages ({self.data.train_pages}) must be at least one batch "
                             f"(training.per_device_train_batch_size={self.training.per_device_train_batch_size})")
        if self.data.test_pages < 1:
            raise ValueError("data.test_pages must be >= 1: the held-out pages give the reported mAP")

    def detector_config(self):
        """The :class:`~sampan.vision.detection.model.DetectorConfig` these settings train (CDLA's classes)."""
        from sampan.vision.backbone import BackboneConfig
        from sampan.vision.detection.model import DetectorConfig
        from sampan.vision.layout.classes import CLASSES

        backbone = BackboneConfig(stem_channels=self.stem_channels, stage_channels=self.stage_channels,
                                  stage_blocks=self.stage_blocks)
        return DetectorConfig(num_classes=len(CLASSES), class_names=CLASSES, backbone=backbone, width=self.width,
                              reg_max=self.reg_max, input_size=self.input_size)

"""The ``ocr-det-zh`` recipe's settings (the code is :mod:`sampan.vision.train_det`), torch-free so
that ``sampan hub build --help`` lists them without importing torch."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from sampan.trainer.arguments import TrainingArguments
from sampan.utils.config import nested, refuse_changes, resolve_nested
from sampan.vision.augment import AugmentConfig
from sampan.vision.build import OcrDataConfig
from sampan.vision.db_loss_config import DBLossConfig
from sampan.vision.db_postprocess import DBPostProcessConfig
from sampan.vision.db_targets import DBTargetConfig

STRIDE = 32  # the detector's total stride (sampan.vision.det_db.STRIDE): crop sides must be multiples of it


@dataclasses.dataclass
class CropConfig:
    """How a training sample is cut from a page.

    Fields:
        size: the square crop's side in pixels (a multiple of 32); a page smaller than that at the
            drawn scale is padded with grey.
        scale: the page is resized by a factor uniform in (low, high) before cropping; ``detect``
            sees a 768 x 1024 page at 0.94 (longer side 960).
        crops_per_page: samples drawn from each page per pass (the data set's length is pages x this).
        augment: degradations drawn again on each crop (photometric only: the pages were already
            turned and warped when rendered).
    """

    size: int = 384
    scale: tuple[float, float] = (0.7, 1.1)
    crops_per_page: int = 64
    augment: AugmentConfig = nested(AugmentConfig, rotate_prob=0.0, perspective_prob=0.0, lowres_prob=0.1,
                                    lowres_scale=(0.6, 0.9), blur_prob=0.2, max_blur=1.0, noise_prob=0.2,
                                    max_noise=10.0, jpeg_prob=0.2, jpeg_quality=(30, 90))

    def __post_init__(self) -> None:
        resolve_nested(self)
        if self.size < STRIDE or self.size % STRIDE:
            raise ValueError(f"crop.size must be a positive multiple of {STRIDE}, got {self.size}")
        low, high = self.scale
        if not 0.1 <= low <= high <= 4.0:
            raise ValueError(f"crop.scale must be (low, high) with 0.1 <= low <= high <= 4, got {self.scale}")
        if self.crops_per_page < 1:
            raise ValueError(f"crop.crops_per_page must be >= 1, got {self.crops_per_page}")
        if self.augment.rotate_prob or self.augment.perspective_prob:
            raise ValueError("crop.augment must leave rotate_prob and perspective_prob at 0: they grow the canvas "
                             "(the pages were turned and warped when rendered)")


@dataclasses.dataclass
class OcrDetRecipe:
    """ocr-det-zh: the DB detector (LCNet + DB FPN + DB head) trained on rendered pages.

    Fields:
        data: the page pool (``sampan data build-ocr``, pages only), rendered once and reused.
        stem_channels: channels of the LCNet backbone's first convolution.
        stage_channels: output channels of the backbone's four stages.
        stage_blocks: depthwise-separable blocks in each stage.
        neck_channels: channels of the FPN's fused 1/4-resolution features.
        targets: how DB targets are drawn (shrink ratio, threshold range).
        postprocess: how boxes are read from the probability map; its ``unclip_ratio`` is replaced
            by the rule that scored best on the dev pages.
        loss: the DB loss's weights.
        crop: how training samples are cut from pages.
        training: the Trainer's arguments (a rerun of the same build resumes from the newest checkpoint);
            its ``eval_steps`` is how often the dev pages are scored (0: only at the end).
        dev_pages: the first this many test pages pick the best checkpoint and the unclip rule; the
            other test pages give the reported figures.
        iou: the IoU at which a detected box matches a labelled line.
        export_only: train nothing: score and store the run's best model so far (a snapshot while
            the run goes on, from another process).
    """

    RENAMED: ClassVar[dict[str, str]] = {"steps": "training.max_steps", "seed": "training.seed",
                                         "batch_size": "training.per_device_train_batch_size",
                                         "learning_rate": "training.learning_rate"}
    OWNED: ClassVar[dict[str, str]] = {
        "data.out": "set by the recipe ($SAMPAN_HOME/build/ocr-det-pages-<digest>)",
        "training.output_dir": "set by the recipe ($SAMPAN_HOME/build/ocr-det-zh)"}

    data: OcrDataConfig = nested(OcrDataConfig, out="", train_lines=0, test_lines=0, train_pages=1000, test_pages=60)
    stem_channels: int = 16
    stage_channels: tuple[int, int, int, int] = (32, 64, 128, 256)
    stage_blocks: tuple[int, int, int, int] = (1, 2, 2, 2)
    neck_channels: int = 96
    targets: DBTargetConfig = nested(DBTargetConfig)
    postprocess: DBPostProcessConfig = nested(DBPostProcessConfig)
    loss: DBLossConfig = nested(DBLossConfig)
    crop: CropConfig = nested(CropConfig)
    training: TrainingArguments = nested(
        TrainingArguments, max_steps=5000, per_device_train_batch_size=8, learning_rate=2e-3, lr_scheduler="cosine",
        warmup_steps=200, min_lr_ratio=0.05, weight_decay=1e-4, max_grad_norm=5.0, seed=0, logging_steps=20,
        save_steps=300, eval_steps=600, save_total_limit=2, resume_from_checkpoint="auto", overwrite_output_dir=True,
        tensorboard=False, progress_bar=False)
    dev_pages: int = 30
    iou: float = 0.5
    export_only: bool = False

    def __post_init__(self) -> None:
        resolve_nested(self)
        refuse_changes(self)
        if self.neck_channels < 1:
            raise ValueError(f"neck_channels must be >= 1, got {self.neck_channels}")
        if not 0 < self.dev_pages < self.data.test_pages:
            raise ValueError(f"dev_pages must be in [1, data.test_pages - 1] ({self.data.test_pages - 1}): the rest "
                             f"of the test pages give the reported figures, got {self.dev_pages}")
        if not 0.0 < self.iou < 1.0:
            raise ValueError(f"iou must be in (0, 1), got {self.iou}")

    def detector_config(self):
        """The :class:`~sampan.vision.det_db.DBDetectorConfig` these settings train."""
        from sampan.vision.backbone import BackboneConfig
        from sampan.vision.det_db import DBDetectorConfig

        backbone = BackboneConfig(stem_channels=self.stem_channels, stage_channels=self.stage_channels,
                                  stage_blocks=self.stage_blocks)
        return DBDetectorConfig(backbone=backbone, neck_channels=self.neck_channels, targets=self.targets,
                                postprocess=self.postprocess)

"""The DB text detector (PP-OCR's detection model): LCNet backbone + DB FPN + DB head, with image
preprocessing and :func:`~sampan.vision.db_postprocess.boxes_from_map` in ``detect``."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import torch
from PIL import Image

from sampan.nn import Layer
from sampan.vision import model_io
from sampan.vision.backbone import BackboneConfig, LCNetBackbone
from sampan.vision.db_head import DBHead
from sampan.vision.db_postprocess import DBPostProcessConfig, TextBox, boxes_from_map
from sampan.vision.db_targets import DBTargetConfig
from sampan.vision.neck import DBFPN

MODEL_TYPE = "sampan_db_detector"
STRIDE = 32  # the backbone's total stride: input sides must be multiples of it
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclasses.dataclass
class DBDetectorConfig:
    """A DB detector.

    Fields:
        backbone: the LCNet backbone (its strides must multiply to 32 over the 4 stages + stem).
        neck_channels: channels of the FPN's fused 1/4-resolution features.
        k: DB's binarisation steepness.
        targets: how training targets are drawn (shrink ratio, threshold range).
        postprocess: how boxes are read from the probability map.
        limit_side: ``detect`` resizes so the longer side is at most this (then to multiples of 32).
        mean: per-channel mean of the normalised RGB input (0..1 scale).
        std: per-channel standard deviation of the normalised input.
    """

    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    neck_channels: int = 96
    k: float = 50.0
    targets: DBTargetConfig = dataclasses.field(default_factory=DBTargetConfig)
    postprocess: DBPostProcessConfig = dataclasses.field(default_factory=DBPostProcessConfig)
    limit_side: int = 960
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self):
        stride = 2 * int(np.prod([s[0] for s in self.backbone.stage_strides]))
        if stride != STRIDE or any(s[0] != s[1] for s in self.backbone.stage_strides):
            raise ValueError(f"DBDetectorConfig.backbone must stride 2 both ways in the stem and every stage "
                             f"(total {STRIDE}), got {self.backbone.stage_strides}")
        if self.limit_side < STRIDE:
            raise ValueError(f"DBDetectorConfig.limit_side must be >= {STRIDE}, got {self.limit_side}")
        if self.postprocess.shrink_ratio != self.targets.shrink_ratio:
            raise ValueError(f"postprocess.shrink_ratio ({self.postprocess.shrink_ratio}) must equal "
                             f"targets.shrink_ratio ({self.targets.shrink_ratio}): the unclip undoes that shrink")
        self.mean = tuple(float(v) for v in self.mean)
        self.std = tuple(float(v) for v in self.std)
        if len(self.mean) != self.backbone.in_channels or len(self.std) != self.backbone.in_channels:
            raise ValueError("DBDetectorConfig.mean and .std need one value per input channel")

    @classmethod
    def tiny(cls) -> DBDetectorConfig:
        """A ~24K-parameter detector for tests (it learns black bars on a white page in ~40 steps)."""
        return cls(backbone=BackboneConfig(stem_channels=8, stage_channels=(16, 24, 32, 48), stage_blocks=(1, 1, 1, 1)),
                   neck_channels=32)


class DBDetector(Layer):
    """``forward(images)``: ``(N, 3, H, W)`` normalised images (H, W multiples of 32) to DB maps,
    ``(N, 3, H, W)`` in training, the probability ``(N, 1, H, W)`` in eval. ``detect(image)``: one RGB
    image (uint8 ``(H, W, 3)`` array or PIL image) to text boxes in its pixels."""

    def __init__(self, config: DBDetectorConfig | None = None):
        super().__init__()
        self.config = config or DBDetectorConfig()
        self.backbone = LCNetBackbone(self.config.backbone)
        self.neck = DBFPN(self.backbone.out_channels, self.config.neck_channels)
        self.head = DBHead(self.neck.out_channels, self.config.k)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        model_io.check_images(images, self.config.backbone.in_channels, "DBDetector", multiple=STRIDE)
        return self.head(self.neck(self.backbone(images)))

    def preprocess(self, image) -> tuple[torch.Tensor, tuple[float, float], tuple[int, int]]:
        """``(batch of one, (sx, sy) map-to-image scale, (height, width))`` for an RGB image."""
        pil = model_io.to_rgb(image, "detect")
        w, h = pil.size
        ratio = min(1.0, self.config.limit_side / max(w, h))
        nw = max(STRIDE, int(round(w * ratio / STRIDE)) * STRIDE)
        nh = max(STRIDE, int(round(h * ratio / STRIDE)) * STRIDE)
        array = np.asarray(pil.resize((nw, nh), Image.Resampling.BILINEAR), dtype=np.float32) / 255.0
        array = (array - np.asarray(self.config.mean, np.float32)) / np.asarray(self.config.std, np.float32)
        batch = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))[None]
        return batch, (w / nw, h / nh), (h, w)

    @torch.no_grad()
    def detect(self, image) -> list[TextBox]:
        """Text boxes of one image, in reading order (the model is put in eval mode)."""
        self.eval()
        batch, scale, size = self.preprocess(image)
        prob = self(batch.to(next(self.parameters()).device))[0, 0].float().cpu().numpy()
        return boxes_from_map(prob, self.config.postprocess, scale=scale, image_size=size)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """Write ``config.json`` + ``model.safetensors`` into ``directory`` (atomically)."""
        model_io.save_model(self, self.config, MODEL_TYPE, directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> DBDetector:
        """The detector :meth:`save_pretrained` wrote."""
        model = cls(model_io.load_config(DBDetectorConfig, MODEL_TYPE, directory))
        model_io.load_weights(model, directory)
        return model


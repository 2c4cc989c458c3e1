"""PicoDet-like anchor-free detector: LCNet backbone, light FPN neck, shared GFL head, decode + NMS."""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.nn.functional as F
from torch import nn

from sampan.nn import Layer
from sampan.vision.backbone import BackboneConfig, ConvBN, DepthwiseSeparable, LCNetBackbone
from sampan.vision.box_ops import batched_nms
from sampan.vision.model_io import load_config, load_weights, save_model

MODEL_TYPE = "sampan-detector"


@dataclasses.dataclass
class DetectorConfig:
    """Shape of a :class:`Detector`.

    Fields:
        num_classes: object classes (no background class: scores are per-class sigmoids).
        class_names: one name per class (saved with the model so predictions carry labels).
        backbone: LCNet backbone; its last three stages feed strides 8, 16, 32.
        width: channels of the neck and head.
        reg_max: DFL bins per box side: a side's distance is the expectation over ``0..reg_max`` strides.
        input_size: square side images are letterboxed to (a multiple of 32).
    """

    num_classes: int = 1
    class_names: tuple[str, ...] = ()
    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    width: int = 64
    reg_max: int = 7
    input_size: int = 320

    def __post_init__(self):
        self.class_names = tuple(self.class_names) or tuple(f"class_{i}" for i in range(self.num_classes))
        if self.num_classes < 1 or len(self.class_names) != self.num_classes:
            raise ValueError(f"DetectorConfig: num_classes={self.num_classes} needs that many class_names, "
                             f"got {len(self.class_names)}")
        if len(self.backbone.stage_channels) < 3:
            raise ValueError("DetectorConfig.backbone needs at least 3 stages (strides 8, 16, 32)")
        if self.input_size % 32:
            raise ValueError(f"DetectorConfig.input_size must be a multiple of 32, got {self.input_size}")

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides of the three feature levels the head runs on."""
        total, out = 2, []  # the stem halves
        for s in self.backbone.stage_strides:
            total *= s[0]
            out.append(total)
        return tuple(out[-3:])


class Detector(Layer):
    """``forward(images)`` -> ``(cls_logits (b, n, c), reg_logits (b, n, 4 * (reg_max + 1)))`` over all
    anchor points of all levels (row-major per level, levels in stride order): the raw outputs ONNX
    export keeps; :meth:`decode` turns them into boxes outside the graph."""

    def __init__(self, config: DetectorConfig):
        super().__init__()
        self.config = config
        self.backbone = LCNetBackbone(config.backbone)
        w = config.width
        self.lateral = nn.ModuleList(ConvBN(c, w, 1) for c in self.backbone.out_channels[-3:])
        self.smooth = nn.ModuleList(DepthwiseSeparable(w, w, 3, 1, False) for _ in range(3))
        # One head shared across strides, as in GFL/PicoDet: scale differences live in the stride factor.
        self.tower = nn.Sequential(DepthwiseSeparable(w, w, 3, 1, False), DepthwiseSeparable(w, w, 3, 1, False))
        self.cls = nn.Conv2d(w, config.num_classes, 1)
        self.reg = nn.Conv2d(w, 4 * (config.reg_max + 1), 1)
        nn.init.constant_(self.cls.bias, -4.6)  # prior 0.01: few anchors are objects at the start

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = [lat(f) for lat, f in zip(self.lateral, self.backbone(images)[-3:], strict=True)]
        for i in (1, 0):  # top-down: coarse context into finer levels
            feats[i] = feats[i] + F.interpolate(feats[i + 1], size=feats[i].shape[-2:], mode="nearest")
        cls_out, reg_out = [], []
        for smooth, f in zip(self.smooth, feats, strict=True):
            t = self.tower(smooth(f))
            cls_out.append(self.cls(t).flatten(2).transpose(1, 2))
            reg_out.append(self.reg(t).flatten(2).transpose(1, 2))
        return torch.cat(cls_out, 1), torch.cat(reg_out, 1)

    def anchor_points(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Centres ``(n, 2)`` (x, y pixels) and strides ``(n,)`` of the anchors for an input size."""
        return anchor_points(self.config, height, width)

    def boxes_from_reg(self, reg_logits: torch.Tensor, points: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
        """Boxes ``(..., n, 4)`` x0,y0,x1,y1 from DFL logits: each side is the expected bin times the stride."""
        return boxes_from_reg(self.config, reg_logits, points, strides)

    @torch.no_grad()
    def decode(self, cls_logits: torch.Tensor, reg_logits: torch.Tensor, height: int, width: int,
               score_threshold: float = 0.3, iou_threshold: float = 0.6, max_detections: int = 100) -> list[dict]:
        """Detections of ONE image's raw outputs ``(n, c)``, ``(n, 4*(reg_max+1))``: class-aware NMS,
        boxes in input pixels. Returns ``[{"label", "class_id", "score", "box"}]`` best first."""
        return decode(self.config, cls_logits, reg_logits, height, width, score_threshold, iou_threshold,
                      max_detections)

    @torch.no_grad()
    def predict(self, image, score_threshold: float = 0.3, iou_threshold: float = 0.6) -> list[dict]:
        """Detect objects in a PIL image (or a path): ``[{"label", "score", "box"}]`` with boxes
        x0,y0,x1,y1 in the image's own pixels, best first."""
        from PIL import Image

        from sampan.vision.detection.letterbox import letterbox_pixels

        image = Image.open(image) if isinstance(image, (str, os.PathLike)) else image
        size = self.config.input_size
        pixels, scale = letterbox_pixels(image, size)
        cls, reg = self(torch.from_numpy(pixels)[None])
        found = self.decode(cls[0], reg[0], size, size, score_threshold, iou_threshold)
        return to_image_pixels(found, scale, image.width, image.height)

    def save_pretrained(self, directory: str | os.PathLike):
        """Write the model directory (config.json + model.safetensors)."""
        return save_model(self, self.config, MODEL_TYPE, directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> Detector:
        """Load a directory written by :meth:`save_pretrained`."""
        model = cls(load_config(DetectorConfig, MODEL_TYPE, directory))
        load_weights(model, directory)
        return model.eval()


# -- decoding outside the network: the eager model and the exported one's predictor share it ---------
def anchor_points(config: DetectorConfig, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Centres ``(n, 2)`` (x, y pixels) and strides ``(n,)`` of a detector's anchors for an input size,
    in the order of the network's outputs (levels in stride order, row-major within a level)."""
    points, strides = [], []
    for s in config.strides:
        ys, xs = torch.meshgrid(torch.arange(-(-height // s)), torch.arange(-(-width // s)), indexing="ij")
        p = (torch.stack([xs.flatten(), ys.flatten()], 1).float() + 0.5) * s
        points.append(p)
        strides.append(torch.full((p.shape[0],), float(s)))
    return torch.cat(points), torch.cat(strides)


def boxes_from_reg(config: DetectorConfig, reg_logits: torch.Tensor, points: torch.Tensor,
                   strides: torch.Tensor) -> torch.Tensor:
    """Boxes ``(..., n, 4)`` x0,y0,x1,y1 from DFL logits: each side is the expected bin times the stride."""
    bins = torch.arange(config.reg_max + 1, dtype=reg_logits.dtype)
    dist = (reg_logits.unflatten(-1, (4, -1)).softmax(-1) * bins).sum(-1) * strides[:, None]
    return torch.cat([points - dist[..., :2], points + dist[..., 2:]], -1)


@torch.no_grad()
def decode(config: DetectorConfig, cls_logits: torch.Tensor, reg_logits: torch.Tensor, height: int, width: int,
           score_threshold: float = 0.3, iou_threshold: float = 0.6, max_detections: int = 100) -> list[dict]:
    """Detections of ONE image's raw outputs ``(n, c)``, ``(n, 4*(reg_max+1))`` (a ``Detector``'s or
    its export's): class-aware NMS, boxes in input pixels. Returns ``[{"label", "class_id", "score",
    "box"}]`` best first."""
    points, strides = anchor_points(config, height, width)
    boxes = boxes_from_reg(config, reg_logits, points, strides)
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0, width)
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0, height)
    scores = cls_logits.sigmoid()
    anchor, cls = (scores > score_threshold).nonzero(as_tuple=True)
    keep = batched_nms(boxes[anchor], scores[anchor, cls], cls, iou_threshold)[:max_detections]
    return [{"label": config.class_names[int(cls[k])], "class_id": int(cls[k]),
             "score": float(scores[anchor[k], cls[k]]), "box": [float(v) for v in boxes[anchor[k]]]}
            for k in keep]


def to_image_pixels(found: list[dict], scale: float, width: int, height: int) -> list[dict]:
    """Detections on the letterboxed input moved back to the image's own pixels (divided by the
    letterbox ``scale``, clipped to the ``width`` x ``height`` image), in place; returns them."""
    for d in found:
        d["box"] = [min(v / scale, width if i % 2 == 0 else height) for i, v in enumerate(d["box"])]
    return found

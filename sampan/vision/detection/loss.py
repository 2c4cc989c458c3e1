"""The detector's training loss: TAL assignment, then QFL on scores, GIoU + DFL on positive boxes."""

from __future__ import annotations

import torch

from sampan.vision.detection.assigner import task_aligned_assign
from sampan.vision.detection.losses import distribution_focal_loss, giou_loss, quality_focal_loss
from sampan.vision.detection.model import Detector


def detection_loss(model: Detector, cls_logits: torch.Tensor, reg_logits: torch.Tensor, height: int, width: int,
                   gt_boxes: list[torch.Tensor], gt_labels: list[torch.Tensor],
                   weights: tuple[float, float, float] = (1.0, 2.0, 0.25)) -> dict[str, torch.Tensor]:
    """Loss of a batch: ``gt_boxes[i]`` (g, 4) x0,y0,x1,y1 pixels, ``gt_labels[i]`` (g,) class indices.
    Returns ``loss`` and its parts ``qfl``, ``giou``, ``dfl`` (each normalised by the positives' quality)."""
    points, strides = model.anchor_points(height, width)
    reg_max = model.config.reg_max
    qfl = giou = dfl = cls_logits.new_zeros(())
    norm = cls_logits.new_zeros(())
    for i in range(cls_logits.shape[0]):
        boxes = model.boxes_from_reg(reg_logits[i], points, strides)
        a = task_aligned_assign(cls_logits[i].sigmoid(), boxes, points, gt_boxes[i], gt_labels[i])
        target = torch.zeros_like(cls_logits[i])
        pos = a.gt_index >= 0
        target[pos, a.labels[pos]] = a.quality[pos]
        qfl = qfl + quality_focal_loss(cls_logits[i], target).sum()
        if pos.any():
            w = a.quality[pos]
            giou = giou + (giou_loss(boxes[pos], a.boxes[pos]) * w).sum()
            # DFL targets: distances of the gt sides from the anchor point, in strides.
            p, s = points[pos], strides[pos, None]
            sides = torch.cat([p - a.boxes[pos, :2], a.boxes[pos, 2:] - p], 1) / s
            logits = reg_logits[i][pos].unflatten(-1, (4, reg_max + 1)).reshape(-1, reg_max + 1)
            dfl = dfl + (distribution_focal_loss(logits, sides.reshape(-1)).view(-1, 4).mean(1) * w).sum()
            norm = norm + w.sum()
    norm = norm.clamp(min=1.0)
    qfl, giou, dfl = qfl / norm, giou / norm, dfl / norm
    return {"loss": weights[0] * qfl + weights[1] * giou + weights[2] * dfl, "qfl": qfl, "giou": giou, "dfl": dfl}

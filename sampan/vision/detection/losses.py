"""GFL-style detection losses: GIoU, distribution focal loss (DFL) and quality focal loss (QFL)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sampan.vision.box_ops import box_area


def giou_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-pair ``1 - GIoU`` of ``(n, 4)`` x0,y0,x1,y1 boxes: 0 for identical boxes, up to 2."""
    top_left = torch.maximum(pred[:, :2], target[:, :2])
    bottom_right = torch.minimum(pred[:, 2:], target[:, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(dim=1)
    union = box_area(pred) + box_area(target) - inter
    iou = inter / union.clamp(min=1e-9)
    # The smallest enclosing box penalises distance even when the boxes do not overlap.
    hull = (torch.maximum(pred[:, 2:], target[:, 2:]) - torch.minimum(pred[:, :2], target[:, :2])).clamp(min=0).prod(dim=1)
    giou = iou - (hull - union) / hull.clamp(min=1e-9)
    return 1.0 - giou


def distribution_focal_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """DFL: ``logits`` (n, reg_max + 1) over integer bins, ``target`` (n,) continuous in [0, reg_max].

    The two bins around the target share the cross-entropy in proportion to their nearness, so the
    expected bin of the learnt distribution converges on the continuous target."""
    reg_max = logits.shape[-1] - 1
    target = target.clamp(0, reg_max - 1e-4)
    left = target.floor().long()
    w_right = target - left.to(target.dtype)
    return (F.cross_entropy(logits, left, reduction="none") * (1 - w_right)
            + F.cross_entropy(logits, left + 1, reduction="none") * w_right)


def quality_focal_loss(logits: torch.Tensor, quality: torch.Tensor, beta: float = 2.0) -> torch.Tensor:
    """QFL: sigmoid ``logits`` (n, c) against soft targets ``quality`` (n, c) in [0, 1] (IoU for the
    assigned class, 0 elsewhere), down-weighted by ``|quality - sigmoid|^beta`` like a focal loss."""
    sigma = logits.sigmoid()
    bce = F.binary_cross_entropy_with_logits(logits, quality, reduction="none")
    return bce * (quality - sigma).abs().pow(beta)

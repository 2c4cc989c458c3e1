"""Task-aligned assigner (TAL, as in TOOD / PP-PicoDet v2): which anchor learns which ground truth."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sampan.vision.box_ops import box_iou


@dataclass
class Assignment:
    """Per-anchor result: ``gt_index`` (-1 for background), ``labels`` (-1 for background),
    ``boxes`` (matched gt box, zeros for background) and ``quality`` (normalised alignment, QFL target)."""

    gt_index: torch.Tensor
    labels: torch.Tensor
    boxes: torch.Tensor
    quality: torch.Tensor


def task_aligned_assign(scores: torch.Tensor, pred_boxes: torch.Tensor, anchor_points: torch.Tensor,
                        gt_boxes: torch.Tensor, gt_labels: torch.Tensor, top_k: int = 13,
                        alpha: float = 1.0, beta: float = 6.0) -> Assignment:
    """Assign anchors of one image: ``scores`` (a, c) sigmoid class scores, ``pred_boxes`` (a, 4),
    ``anchor_points`` (a, 2) centres, ``gt_boxes`` (g, 4), ``gt_labels`` (g,).

    Each gt takes the ``top_k`` anchors *inside it* with the largest ``s^alpha * IoU^beta``; an anchor
    claimed by several gts keeps the one it overlaps most."""
    a = anchor_points.shape[0]
    if gt_boxes.numel() == 0:
        return Assignment(torch.full((a,), -1, dtype=torch.long), torch.full((a,), -1, dtype=torch.long),
                          torch.zeros(a, 4), torch.zeros(a))
    iou = box_iou(gt_boxes, pred_boxes.detach())  # (g, a)
    cls_score = scores.detach()[:, gt_labels].T  # (g, a): score of each gt's own class
    align = cls_score.pow(alpha) * iou.pow(beta)
    x, y = anchor_points[:, 0], anchor_points[:, 1]
    inside = ((x[None] > gt_boxes[:, 0:1]) & (x[None] < gt_boxes[:, 2:3])
              & (y[None] > gt_boxes[:, 1:2]) & (y[None] < gt_boxes[:, 3:4]))
    # Tiny epsilon keeps a positive ordering among inside anchors even before scores have learnt anything.
    masked = torch.where(inside, align + 1e-9, torch.zeros_like(align))
    k = min(top_k, a)
    top = masked.topk(k, dim=1).indices
    candidate = torch.zeros_like(inside)
    candidate.scatter_(1, top, True)
    candidate &= inside
    overlap = torch.where(candidate, iou, torch.full_like(iou, -1.0))
    best_iou, gt_index = overlap.max(dim=0)
    positive = best_iou >= 0
    gt_index = torch.where(positive, gt_index, torch.full_like(gt_index, -1))
    labels = torch.where(positive, gt_labels[gt_index.clamp(min=0)], torch.full_like(gt_index, -1))
    boxes = torch.where(positive[:, None], gt_boxes[gt_index.clamp(min=0)], torch.zeros(a, 4))
    # Normalise alignment per gt so its best anchor's target equals its best IoU (as TOOD does).
    align_pos = torch.where(candidate, align, torch.zeros_like(align))
    norm = align_pos / align_pos.amax(dim=1, keepdim=True).clamp(min=1e-9) * (iou * candidate).amax(dim=1, keepdim=True)
    quality = torch.where(positive, norm.gather(0, gt_index.clamp(min=0)[None]).squeeze(0), torch.zeros(a))
    return Assignment(gt_index, labels, boxes, quality)

"""Axis-aligned box operations in torch: area, pairwise IoU, NMS and per-class NMS.

torchvision does not import beside the CPU torch sampan tests on (docs: /work/shared/TORCH-FACTS.md),
so these are the few lines of torch that replace ``torchvision.ops``. Boxes are ``(n, 4)`` as
``x0, y0, x1, y1`` with ``x1 >= x0`` and ``y1 >= y0``.
"""

from __future__ import annotations

import torch


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Areas of ``(n, 4)`` boxes."""
    return (boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(n, m)`` IoU of every box in ``a`` with every box in ``b``."""
    top_left = torch.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (bottom_right - top_left).clamp(min=0).prod(dim=2)
    union = box_area(a)[:, None] + box_area(b)[None, :] - inter
    return inter / union.clamp(min=1e-12)


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices of the boxes greedy non-maximum suppression keeps, best score first: a box is dropped
    when its IoU with a kept, higher-scoring box exceeds ``iou_threshold``."""
    if boxes.ndim != 2 or boxes.shape[-1] != 4 or scores.shape != boxes.shape[:1]:
        raise ValueError(f"nms takes (n, 4) boxes and (n,) scores, got {tuple(boxes.shape)} and "
                         f"{tuple(scores.shape)}")
    order = torch.argsort(scores, descending=True)
    if order.numel() == 0:
        return order
    iou = box_iou(boxes[order], boxes[order])
    suppressed = torch.zeros(order.numel(), dtype=torch.bool)
    keep = []
    for i in range(order.numel()):  # n is small after score filtering; the matrix is computed once
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= iou[i] > iou_threshold
    return order[torch.tensor(keep, dtype=torch.long)]


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor,
                iou_threshold: float) -> torch.Tensor:
    """NMS within each class: boxes of different classes are moved apart so they never overlap."""
    if boxes.numel() == 0:
        return torch.empty(0, dtype=torch.long)
    shift = classes.to(boxes.dtype)[:, None] * (boxes.max() - boxes.min() + 1)
    return nms(boxes + shift, scores, iou_threshold)

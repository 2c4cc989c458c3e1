"""The DB loss: balanced BCE with hard-negative mining (3 negatives per positive) on the probability
map, masked L1 on the threshold map, dice on the approximate binary map;
``total = alpha * bce + beta * l1 + dice`` (DB's alpha = 5, beta = 10)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from sampan.vision.db_loss_config import DBLossConfig  # torch-free, for the recipe's settings


def balanced_bce(pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor, negative_ratio: float = 3.0,
                 eps: float = 1e-6) -> torch.Tensor:
    """BCE over all positive pixels and the hardest ``negative_ratio x positives`` negatives."""
    positive = gt * mask
    negative = (1 - gt) * mask
    n_pos = int(positive.sum().item())
    n_neg = min(int(negative.sum().item()), int(n_pos * negative_ratio))
    if n_pos == 0:  # a page without text: learn from some negatives all the same
        n_neg = min(int(negative.sum().item()), 100)
    loss = F.binary_cross_entropy(pred.clamp(eps, 1 - eps), gt, reduction="none")
    pos_loss = (loss * positive).sum()
    neg_loss = torch.topk((loss * negative).flatten(), n_neg).values.sum() if n_neg > 0 else loss.sum() * 0
    return (pos_loss + neg_loss) / (n_pos + n_neg + eps)


def masked_l1(pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Mean absolute error where ``mask`` is 1."""
    return ((pred - gt).abs() * mask).sum() / (mask.sum() + eps)


def dice_loss(pred: torch.Tensor, gt: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``1 - 2 |P n G| / (|P| + |G|)`` over the masked pixels."""
    inter = (pred * gt * mask).sum()
    union = (pred * mask).sum() + (gt * mask).sum() + eps
    return 1 - 2 * inter / union


class DBLoss(nn.Module):
    """``forward(maps, targets)`` with ``maps`` the head's training output ``(N, 3, H, W)`` and
    ``targets`` the batched maps of :func:`sampan.vision.db_targets.make_db_targets` (``(N, H, W)``
    tensors); returns a dict with ``loss`` and its parts."""

    def __init__(self, config: DBLossConfig | None = None):
        super().__init__()
        self.config = config or DBLossConfig()

    def forward(self, maps: torch.Tensor, targets: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if maps.ndim != 4 or maps.shape[1] != 3:
            raise ValueError(f"DBLoss needs the head's training maps (N, 3, H, W), got {tuple(maps.shape)}: "
                             "call the model in train() mode")
        missing = {"shrink_map", "shrink_mask", "threshold_map", "threshold_mask"} - set(targets)
        if missing:
            raise KeyError(f"DBLoss targets lack {sorted(missing)} (make_db_targets makes all four)")
        if targets["shrink_map"].shape != maps[:, 0].shape:
            raise ValueError(f"DBLoss targets are {tuple(targets['shrink_map'].shape)} but the maps are "
                             f"{tuple(maps[:, 0].shape)}: draw targets at the input image's size")
        c = self.config
        prob, thresh, binary = maps[:, 0], maps[:, 1], maps[:, 2]
        gt, mask = targets["shrink_map"], targets["shrink_mask"]
        bce = balanced_bce(prob, gt, mask, c.negative_ratio, c.eps)
        l1 = masked_l1(thresh, targets["threshold_map"], targets["threshold_mask"], c.eps)
        dice = dice_loss(binary, gt, mask, c.eps)
        return {"loss": c.alpha * bce + c.beta * l1 + dice, "bce": bce, "l1": l1, "dice": dice}

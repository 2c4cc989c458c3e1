"""DB's feature pyramid neck: stage features fused top-down, each smoothed, upsampled to the finest
(1/4) resolution and concatenated."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from sampan.nn import Layer


class DBFPN(Layer):
    """Lateral 1x1 convs to ``inner_channels``, top-down sum, a 3x3 conv per level to
    ``inner_channels // levels``, all resized to the first level and concatenated
    (``inner_channels`` out)."""

    def __init__(self, in_channels: tuple[int, ...], inner_channels: int = 96):
        super().__init__()
        levels = len(in_channels)
        if inner_channels % levels:
            raise ValueError(f"DBFPN inner_channels ({inner_channels}) must divide by the number of levels "
                             f"({levels}): each level contributes inner_channels // levels channels")
        self.lateral = nn.ModuleList(nn.Conv2d(c, inner_channels, 1, bias=False) for c in in_channels)
        self.smooth = nn.ModuleList(nn.Conv2d(inner_channels, inner_channels // levels, 3, padding=1, bias=False)
                                    for _ in in_channels)
        self.out_channels = inner_channels

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        lateral = [conv(f) for conv, f in zip(self.lateral, features, strict=True)]
        for i in range(len(lateral) - 2, -1, -1):  # coarse to fine: each level adds the one above it
            # sizes, not scale factors: odd sizes stay aligned and exports keep dynamic shapes
            lateral[i] = lateral[i] + F.interpolate(lateral[i + 1], size=lateral[i].shape[-2:], mode="nearest")
        size = lateral[0].shape[-2:]
        fused = [F.interpolate(conv(x), size=size, mode="nearest") if i else conv(x)
                 for i, (conv, x) in enumerate(zip(self.smooth, lateral, strict=True))]
        return torch.cat(fused[::-1], dim=1)

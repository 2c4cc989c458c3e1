"""The DB head: a probability map and a threshold map from the neck's 1/4-resolution features, both
upsampled back to the input size, and their differentiable binarisation ``sigmoid(k (P - T))``."""

from __future__ import annotations

import torch
from torch import nn

from sampan.nn import Layer


class MapBranch(nn.Sequential):
    """3x3 conv, then two stride-2 transposed convs (x4) to a single-channel sigmoid map."""

    def __init__(self, channels: int):
        mid = max(channels // 4, 4)
        super().__init__(
            nn.Conv2d(channels, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.ConvTranspose2d(mid, mid, 2, 2), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.ConvTranspose2d(mid, 1, 2, 2), nn.Sigmoid(),
        )


class DBHead(Layer):
    """Probability and threshold branches.

    In training ``forward`` returns ``(N, 3, H, W)``: probability, threshold, approximate binary map
    (the three the loss needs). In eval it returns only the probability ``(N, 1, H, W)``: inference
    binarises it with a fixed threshold, and the exported graph stays a third as heavy.
    """

    def __init__(self, channels: int, k: float = 50.0):
        super().__init__()
        self.k = float(k)  # DB's amplification: a steep, still differentiable step
        self.probability = MapBranch(channels)
        self.threshold = MapBranch(channels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        prob = self.probability(features)
        if not self.training:
            return prob
        thresh = self.threshold(features)
        binary = torch.sigmoid(self.k * (prob - thresh))
        return torch.cat([prob, thresh, binary], dim=1)

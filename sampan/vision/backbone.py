"""A light convolutional backbone in the PP-LCNet style (depthwise-separable blocks, hard-swish,
optional squeeze-excitation), returning one feature map per stage.

The same blocks serve the DB detector (strides 2 in both directions: features at 1/4 .. 1/32) and the
line recogniser (later stages stride only in height, so the width, the time axis of CTC, stays long).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from sampan.nn import Layer


@dataclasses.dataclass
class BackboneConfig:
    """Shape of a :class:`LCNetBackbone`.

    Fields:
        in_channels: image channels (3 for RGB).
        stem_channels: channels of the first 3x3 stride-2 convolution.
        stage_channels: output channels of each stage.
        stage_blocks: depthwise-separable blocks per stage.
        stage_strides: (height, width) stride of each stage's first block.
        kernel_sizes: depthwise kernel size of each stage (PP-LCNet widens the last stages to 5).
        use_se: squeeze-excitation in each stage's last block.
    """

    in_channels: int = 3
    stem_channels: int = 16
    stage_channels: tuple[int, ...] = (32, 64, 128, 256)
    stage_blocks: tuple[int, ...] = (1, 2, 2, 2)
    stage_strides: tuple[tuple[int, int], ...] = ((2, 2), (2, 2), (2, 2), (2, 2))
    kernel_sizes: tuple[int, ...] = (3, 3, 5, 5)
    use_se: tuple[bool, ...] = (False, False, False, True)

    def __post_init__(self):
        self.stage_channels = tuple(int(c) for c in self.stage_channels)
        self.stage_blocks = tuple(int(b) for b in self.stage_blocks)
        self.stage_strides = tuple((int(s[0]), int(s[1])) for s in self.stage_strides)
        self.kernel_sizes = tuple(int(k) for k in self.kernel_sizes)
        self.use_se = tuple(bool(s) for s in self.use_se)
        n = len(self.stage_channels)
        for name in ("stage_blocks", "stage_strides", "kernel_sizes", "use_se"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"BackboneConfig.{name} has {len(getattr(self, name))} entries but there are "
                                 f"{n} stages (stage_channels): give one per stage")
        if self.in_channels < 1 or self.stem_channels < 1 or min(self.stage_channels) < 1:
            raise ValueError("BackboneConfig channels must be positive")
        if min(self.stage_blocks) < 1:
            raise ValueError(f"BackboneConfig.stage_blocks must all be >= 1, got {self.stage_blocks}")
        if any(k % 2 == 0 for k in self.kernel_sizes):
            raise ValueError(f"BackboneConfig.kernel_sizes must be odd (same padding), got {self.kernel_sizes}")


class ConvBN(nn.Sequential):
    """Convolution without bias, batch norm, then hard-swish (or nothing with ``act=False``)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride=1, groups: int = 1, act: bool = True):
        super().__init__(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.Hardswish() if act else nn.Identity())


class SqueezeExcite(Layer):
    """Channel attention: pooled features through a bottleneck gate the channels."""

    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        self.reduce = nn.Conv2d(channels, max(channels // reduction, 8), 1)
        self.expand = nn.Conv2d(max(channels // reduction, 8), channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = x.mean(dim=(2, 3), keepdim=True)
        return x * nn.functional.hardsigmoid(self.expand(nn.functional.relu(self.reduce(gate))))


class DepthwiseSeparable(Layer):
    """Depthwise ``k x k`` conv (the stride), optional squeeze-excitation, pointwise 1x1 conv."""

    def __init__(self, cin: int, cout: int, kernel: int, stride, use_se: bool):
        super().__init__()
        self.depthwise = ConvBN(cin, cin, kernel, stride, groups=cin)
        self.se = SqueezeExcite(cin) if use_se else nn.Identity()
        self.pointwise = ConvBN(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.se(self.depthwise(x)))


class LCNetBackbone(Layer):
    """Stem + stages of depthwise-separable blocks; ``forward`` returns every stage's output."""

    def __init__(self, config: BackboneConfig):
        super().__init__()
        self.config = config
        self.stem = ConvBN(config.in_channels, config.stem_channels, 3, 2)
        stages, cin = [], config.stem_channels
        for cout, blocks, stride, kernel, se in zip(config.stage_channels, config.stage_blocks, config.stage_strides,
                                                    config.kernel_sizes, config.use_se, strict=True):
            layers = [DepthwiseSeparable(cin, cout, kernel, stride, se and blocks == 1)]
            layers += [DepthwiseSeparable(cout, cout, kernel, 1, se and i == blocks - 2) for i in range(blocks - 1)]
            stages.append(nn.Sequential(*layers))
            cin = cout
        self.stages = nn.ModuleList(stages)

    @property
    def out_channels(self) -> tuple[int, ...]:
        """Channels of each returned feature map."""
        return self.config.stage_channels

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(images)
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return features

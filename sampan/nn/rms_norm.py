"""RMSNorm computed in float32 whatever the input dtype (as Llama and Qwen were trained)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.RMSNorm):
    """``weight * x / sqrt(mean(x^2) + eps)``, normalised in float32 and cast back before the scale.

    torch's ``nn.RMSNorm`` normalises in the input's dtype; in bf16 that rounds the statistics,
    and checkpoints trained with fp32 normalisation (every Llama / Qwen checkpoint) drift from
    their reference logits. The weight multiplies after the cast, as in those models.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__(hidden_size, eps=eps, elementwise_affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), self.normalized_shape, None, self.eps).to(x.dtype)
        return self.weight * normed

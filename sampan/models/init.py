"""Weight initialisation shared by sampan's transformer models."""

from __future__ import annotations

import math

from torch import nn


def init_transformer_weights(model: nn.Module, std: float, residual_layers: int | None = None) -> None:
    """Normal(0, std) for linear and embedding weights, zeros for biases, ones/zeros for norms.

    With ``residual_layers`` set, output projections that feed the residual stream
    (``out_proj`` and ``fc2``) get ``std / sqrt(2 * residual_layers)``, GPT-2's scaling that keeps
    the residual stream's variance from growing with depth.
    """
    residual_std = std / math.sqrt(2 * residual_layers) if residual_layers else std
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            is_residual = name.endswith(("out_proj", "fc2"))
            nn.init.normal_(module.weight, mean=0.0, std=residual_std if is_residual else std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

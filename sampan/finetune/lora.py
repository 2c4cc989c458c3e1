"""LoRA (Hu et al. 2021): a frozen ``nn.Linear`` plus a trainable low-rank update, merged back for export.

Written here instead of taken from ``peft`` (0.21.2 wraps sampan's plain ``nn.Linear`` modules
fine, measured exact to 3e-8 after ``merge_and_unload``): peft's install requirements pull
``transformers``, ``accelerate`` and ``huggingface_hub`` into sampan's *runtime* dependencies
(transformers is a test-only extra today) and its import costs 2-5 s, for what is ~60 lines
of arithmetic. The parameterisation and init follow peft's defaults (A Kaiming-uniform with
``a = sqrt(5)``, B zeros, scale ``alpha / r``), so results are comparable with peft runs.

Each target keeps its parameter names (``q_proj.weight``, ``q_proj.bias``) and gains
``q_proj.lora_A`` / ``q_proj.lora_B``, so a base checkpoint loads unchanged and an adapter file
holds just the new names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class LoRALinear(nn.Linear):
    """``y = x W^T + b + (dropout(x) A^T B^T) * alpha / r`` with ``W``, ``b`` shared with the wrapped layer."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0):
        nn.Module.__init__(self)  # not nn.Linear.__init__: the weight and bias are the base layer's own
        if rank <= 0:
            raise ValueError(f"LoRA rank must be > 0, got {rank}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, **factory))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, **factory))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B) * self.scaling
        return F.linear(x, self.weight, self.bias) + update

    def delta_weight(self) -> torch.Tensor:
        """The update folded into a weight: ``B @ A * alpha / r``."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def merged(self) -> nn.Linear:
        """A plain ``nn.Linear`` whose weight is ``W + B A alpha / r`` (same outputs, no extra work)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.weight + self.delta_weight())
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        linear.weight.requires_grad_(self.weight.requires_grad)
        if linear.bias is not None:
            linear.bias.requires_grad_(self.bias.requires_grad)
        return linear

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha}"


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def apply_lora(model: nn.Module, targets: Sequence[str], rank: int, alpha: float, dropout: float = 0.0,
               within: str = "ernie.") -> list[str]:
    """Replace every ``nn.Linear`` under ``within`` whose last name part is in ``targets`` by a LoRALinear.

    Returns the replaced module names; no match is an error listing the linear layers there are.
    """
    wanted = set(targets)
    names = [name for name, module in model.named_modules()
             if type(module) is nn.Linear and name.startswith(within) and name.rpartition(".")[2] in wanted]
    if not names:
        linear = sorted({name.rpartition(".")[2] for name, m in model.named_modules()
                         if isinstance(m, nn.Linear) and name.startswith(within)})
        raise ValueError(f"no linear layer named {sorted(wanted)} under {within!r}; its linear layers are {linear}")
    for name in names:
        _set_submodule(model, name, LoRALinear(model.get_submodule(name), rank, alpha, dropout))
    return names


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRALinear of ``model`` into a plain ``nn.Linear`` in place; returns how many."""
    names = [name for name, module in model.named_modules() if isinstance(module, LoRALinear)]
    for name in names:
        _set_submodule(model, name, model.get_submodule(name).merged())
    return len(names)

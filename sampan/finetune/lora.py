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

from sampan.finetune.config import WORD_EMBEDDINGS


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


class LoRAEmbedding(nn.Embedding):
    """``E[ids] + A[ids] B^T * alpha / r``: a frozen embedding table plus a trainable rank-r update.

    Why: a full fine-tune that keeps the 6000 x 256 table frozen (so the task model stores as a small
    delta over its base) cannot give a character a new meaning; a rank-r update can, for
    ``r * (num_embeddings + dim)`` parameters instead of ``num_embeddings * dim``. As in peft,
    ``A`` starts at zero and ``B`` at N(0, 1), so the layer starts as the base table and the first
    steps move ``A``, each character's own coordinates; ``A`` is stored (num_embeddings x r), a
    row per token, so the lookup reads a contiguous table.
    """

    def __init__(self, base: nn.Embedding, rank: int, alpha: float):
        nn.Module.__init__(self)  # not nn.Embedding.__init__: the table is the base layer's own
        if rank <= 0:
            raise ValueError(f"LoRA rank must be > 0, got {rank}")
        self.num_embeddings, self.embedding_dim = base.num_embeddings, base.embedding_dim
        self.padding_idx, self.max_norm, self.norm_type = base.padding_idx, base.max_norm, base.norm_type
        self.scale_grad_by_freq, self.sparse = base.scale_grad_by_freq, base.sparse
        self.weight = base.weight
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Parameter(torch.zeros(self.num_embeddings, rank, **factory))
        self.lora_B = nn.Parameter(torch.randn(self.embedding_dim, rank, **factory))
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, self.lora_A, self.padding_idx)  # (..., r): only the looked-up rows get gradients
        return F.embedding(ids, self.weight, self.padding_idx) + (rows @ self.lora_B.T) * self.scaling

    def delta_weight(self) -> torch.Tensor:
        """The update folded into a table: ``A B^T * alpha / r``, shape (num_embeddings, dim)."""
        return (self.lora_A @ self.lora_B.T) * self.scaling

    def merged(self) -> nn.Embedding:
        """A plain ``nn.Embedding`` holding ``E + A B^T alpha / r`` (same outputs)."""
        table = nn.Embedding(self.num_embeddings, self.embedding_dim, padding_idx=self.padding_idx,
                             device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            table.weight.copy_(self.weight + self.delta_weight())
        table.weight.requires_grad_(self.weight.requires_grad)
        return table

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, rank={self.rank}, alpha={self.alpha}"


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


def apply_embedding_lora(model: nn.Module, rank: int, alpha: float, target: str = WORD_EMBEDDINGS) -> str:
    """Replace the ``nn.Embedding`` at ``target`` by a LoRAEmbedding; returns its name."""
    module = model.get_submodule(target) if target else None
    if type(module) is not nn.Embedding:
        raise ValueError(f"{target!r} is not an nn.Embedding of this model (found {type(module).__name__})")
    _set_submodule(model, target, LoRAEmbedding(module, rank, alpha))
    return target


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRALinear / LoRAEmbedding of ``model`` into a plain layer in place; returns how many."""
    names = [name for name, module in model.named_modules() if isinstance(module, (LoRALinear, LoRAEmbedding))]
    for name in names:
        _set_submodule(model, name, model.get_submodule(name).merged())
    return len(names)

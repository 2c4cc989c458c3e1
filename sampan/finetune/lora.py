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
from sampan.nn.moe_experts import GroupedExperts

# What a LoRA target names on an MoE block's routed experts (``GroupedExperts``): both stacked
# weights, or one of them. Linear targets are last name parts ("q_proj"); these are written with
# "experts." because dense MLPs and shared experts have a ``down_proj`` Linear of their own.
EXPERT_PARAMS = ("gate_up_proj", "down_proj")
EXPERT_TARGETS = {"experts": EXPERT_PARAMS, "experts.gate_up_proj": ("gate_up_proj",),
                  "experts.down_proj": ("down_proj",)}


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


class LoRAExperts(GroupedExperts):
    """Routed experts with a rank-r update per expert on ``gate_up_proj`` and / or ``down_proj``.

    peft 0.21's ``ParamWrapper`` (``LoraConfig(target_parameters=[...])``) on transformers 5's
    fused experts, in its tensor layout, so an adapter saves as a copy: for a stacked weight
    ``W [E, out, in]``, ``lora_A.<param> [E * r, in]`` (expert ``e``'s rows ``e*r .. e*r + r``)
    and ``lora_B.<param> [out, r * E]`` (expert ``e``'s columns ``e, E + e, 2E + e, ...``: peft
    reshapes it ``[out, r, E]``), and ``W[e] += B_e A_e * alpha / r``. Init as peft's: A
    Kaiming-uniform (``a = sqrt(5)``), B zeros, so the layer starts as its base.

    The stacked weights keep their names and objects (``experts.gate_up_proj`` is the base's
    parameter, a base checkpoint loads unchanged); reading the attribute gives ``W + delta``, so
    ``GroupedExperts.forward`` runs unchanged on either of its backends. No dropout: it cannot be
    factored out of a weight update (peft refuses it too).
    """

    def __init__(self, base: GroupedExperts, params: Sequence[str], rank: int, alpha: float):
        nn.Module.__init__(self)  # not GroupedExperts.__init__: the weights are the base's own
        if rank <= 0:
            raise ValueError(f"LoRA rank must be > 0, got {rank}")
        unknown = sorted(set(params) - set(EXPERT_PARAMS))
        if unknown or not params:
            raise ValueError(f"LoRA on experts adapts {list(EXPERT_PARAMS)}, got {list(params)}")
        self.__dict__["base_layer"] = base  # not a submodule: its parameters are registered here
        self.activation, self.backend = base.activation, base.backend
        for name in EXPERT_PARAMS:
            self._parameters[name] = base._parameters[name]
        self.lora_A, self.lora_B = nn.ParameterDict(), nn.ParameterDict()
        for name in EXPERT_PARAMS:  # peft's nesting order (gate_up_proj inside) is this order
            if name not in params:
                continue
            weight = self._parameters[name]
            e, out_features, in_features = weight.shape
            factory = {"device": weight.device, "dtype": weight.dtype}
            self.lora_A[name] = nn.Parameter(torch.empty(e * rank, in_features, **factory))
            self.lora_B[name] = nn.Parameter(torch.zeros(out_features, rank * e, **factory))
            nn.init.kaiming_uniform_(self.lora_A[name], a=math.sqrt(5))
        self.rank, self.alpha = rank, alpha
        self.scaling = alpha / rank

    # Data descriptors on the class win over nn.Module's lookup of ``_parameters``: the forward
    # reads the adapted weights; state_dict and optimisers see the frozen ones.
    @property
    def gate_up_proj(self) -> torch.Tensor:
        return self._adapted("gate_up_proj")

    @property
    def down_proj(self) -> torch.Tensor:
        return self._adapted("down_proj")

    @property
    def adapted_params(self) -> tuple[str, ...]:
        """The stacked weights this layer adapts, in peft's nesting order (innermost first)."""
        return tuple(name for name in EXPERT_PARAMS if name in self.lora_A)

    def _adapted(self, name: str) -> torch.Tensor:
        try:
            weight = self._parameters[name]
        except KeyError:
            raise AttributeError(name) from None
        if name not in self.lora_A:
            return weight
        return weight + self.delta_weight(name).to(weight.dtype)

    def delta_weight(self, name: str) -> torch.Tensor:
        """The update of one stacked weight, ``[E, out, in]``: ``B_e @ A_e * alpha / r`` per expert."""
        a, b = self.lora_A[name], self.lora_B[name]
        e = self._parameters[name].shape[0]
        a3 = a.reshape(e, -1, a.shape[-1])      # [E, r, in]
        b3 = b.reshape(b.shape[0], -1, e)       # [out, r, E], as peft reads it
        return torch.einsum("ore,eri->eoi", b3, a3) * self.scaling

    def merged(self) -> GroupedExperts:
        """The base ``GroupedExperts`` holding ``W + delta`` in new parameters (same outputs)."""
        base = self.__dict__["base_layer"]
        with torch.no_grad():
            for name in self.adapted_params:
                weight = self._parameters[name]
                setattr(base, name, nn.Parameter(weight + self.delta_weight(name).to(weight.dtype),
                                                 requires_grad=weight.requires_grad))
        base.backend = self.backend
        return base

    def unadapted(self) -> GroupedExperts:
        """The base ``GroupedExperts`` as it was (sharing the frozen weights, no update)."""
        base = self.__dict__["base_layer"]
        for name in EXPERT_PARAMS:
            base._parameters[name] = self._parameters[name]
        base.backend = self.backend
        return base

    def extra_repr(self) -> str:
        return f"{list(self.adapted_params)}, rank={self.rank}, alpha={self.alpha}"


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def apply_lora(model: nn.Module, targets: Sequence[str], rank: int, alpha: float, dropout: float = 0.0,
               within: str = "ernie.") -> list[str]:
    """Replace every ``nn.Linear`` under ``within`` whose last name part is in ``targets`` by a LoRALinear.

    On MoE models the target "experts" adapts both stacked weights of every block's routed
    experts (``LoRAExperts``), "experts.gate_up_proj" / "experts.down_proj" one of them (the
    shared experts and dense MLPs are Linear layers: "gate_proj", "up_proj", "down_proj").
    Returns the replaced module names; no match is an error listing the linear layers there are.
    """
    wanted = set(targets)
    expert_params = tuple(p for p in EXPERT_PARAMS if any(p in EXPERT_TARGETS[t] for t in wanted & set(EXPERT_TARGETS)))
    names = [name for name, module in model.named_modules()
             if type(module) is nn.Linear and name.startswith(within) and name.rpartition(".")[2] in wanted]
    experts = [name for name, module in model.named_modules()
               if type(module) is GroupedExperts and name.startswith(within)] if expert_params else []
    if expert_params and not experts and not names:  # a dense model of an MoE family: its MLP targets do
        raise ValueError(f"LoRA target(s) {sorted(wanted & set(EXPERT_TARGETS))} name routed experts, but "
                         f"{type(model).__name__} has no MoE block under {within!r}")
    if expert_params and dropout > 0:
        raise ValueError(f"LoRA on experts takes no dropout (got {dropout}): it cannot be factored out of a weight "
                         "update (peft refuses it too); set lora_dropout=0 or leave 'experts' out of the targets")
    if not names and not experts:
        linear = sorted({name.rpartition(".")[2] for name, m in model.named_modules()
                         if isinstance(m, nn.Linear) and name.startswith(within)})
        raise ValueError(f"no linear layer named {sorted(wanted)} under {within!r}; its linear layers are {linear}")
    for name in names:
        _set_submodule(model, name, LoRALinear(model.get_submodule(name), rank, alpha, dropout))
    for name in experts:
        _set_submodule(model, name, LoRAExperts(model.get_submodule(name), expert_params, rank, alpha))
    return names + experts


def apply_embedding_lora(model: nn.Module, rank: int, alpha: float, target: str = WORD_EMBEDDINGS) -> str:
    """Replace the ``nn.Embedding`` at ``target`` by a LoRAEmbedding; returns its name."""
    module = model.get_submodule(target) if target else None
    if type(module) is not nn.Embedding:
        raise ValueError(f"{target!r} is not an nn.Embedding of this model (found {type(module).__name__})")
    _set_submodule(model, target, LoRAEmbedding(module, rank, alpha))
    return target


def merge_lora(model: nn.Module) -> int:
    """Fold every LoRALinear / LoRAEmbedding / LoRAExperts of ``model`` into a plain layer in place;
    returns how many."""
    names = [name for name, module in model.named_modules()
             if isinstance(module, (LoRALinear, LoRAEmbedding, LoRAExperts))]
    for name in names:
        _set_submodule(model, name, model.get_submodule(name).merged())
    return len(names)

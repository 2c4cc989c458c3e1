"""Houlsby bottleneck adapters (Houlsby et al. 2019, "Parameter-Efficient Transfer Learning for NLP").

In-house because peft 0.21.2 has no bottleneck adapter (its "adapter" methods are LoRA variants,
IA3, BOFT, prompt tuning...; huggingface/peft#244 asking for one is still open) and the
``adapters`` library (AdapterHub) only patches Hugging Face transformers model classes, not
sampan's modules.

An adapter is ``h + up(gelu(down(h)))`` with ``up`` zero-initialised, so a freshly adapted model
computes exactly what the base model does. It sits on each sub-layer's output before the residual
add and LayerNorm, after the attention output projection (``attn.out_proj``) and after the
feed-forward output (``mlp.fc2``), as in the paper. It is inserted by wrapping those two linear
layers (their parameter names stay, so base checkpoints load unchanged). Unlike LoRA the
nonlinearity means it cannot be merged into the base weights: an adapter model keeps the extra
modules at inference (2 x 2 x h x m parameters per layer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

ADAPTER_POINTS = ("out_proj", "fc2")  # attention output, feed-forward output (sampan/nn)


class BottleneckAdapter(nn.Module):
    """``h + up(gelu(down(h)))``: down-projection to ``size``, GELU, zero-initialised up-projection."""

    def __init__(self, hidden_size: int, size: int, init_std: float = 0.02, device=None, dtype=None):
        super().__init__()
        self.down = nn.Linear(hidden_size, size, device=device, dtype=dtype)
        self.up = nn.Linear(size, hidden_size, device=device, dtype=dtype)
        nn.init.normal_(self.down.weight, std=init_std)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.up(F.gelu(self.down(h)))


class AdaptedLinear(nn.Linear):
    """A linear layer followed by a bottleneck adapter; weight and bias are the wrapped layer's own."""

    def __init__(self, base: nn.Linear, size: int):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.adapter = BottleneckAdapter(self.out_features, size, device=base.weight.device, dtype=base.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.adapter(F.linear(x, self.weight, self.bias))


def apply_adapters(model: nn.Module, size: int, within: str = "ernie.layers.",
                   points: tuple[str, ...] = ADAPTER_POINTS) -> list[str]:
    """Wrap every linear under ``within`` whose last name part is in ``points`` (default: sampan's
    ``out_proj`` and ``fc2``; a Llama decoder's are ``o_proj`` and ``down_proj``) with an adapter;
    returns their names."""
    if size <= 0:
        raise ValueError(f"adapter size must be > 0, got {size}")
    names = [name for name, module in model.named_modules()
             if type(module) is nn.Linear and name.startswith(within) and name.rpartition(".")[2] in points]
    if not names:
        raise ValueError(f"no {list(points)} linear layers under {within!r}: adapters go after each block's "
                         "attention output and feed-forward output projections")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, AdaptedLinear(model.get_submodule(name), size))
    return names


@contextlib.contextmanager
def without_adapters(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with each ``AdaptedLinear`` swapped for a plain linear sharing its weight and bias
    while the block runs (the base with whatever else trained, e.g. norms), then swapped back: what
    ``save_pretrained(format="hf")`` can write, since Hugging Face has no bottleneck adapter."""
    layers = {name: m for name, m in model.named_modules() if isinstance(m, AdaptedLinear)}

    def put(name: str, module: nn.Module) -> None:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, module)

    try:
        for name, layer in layers.items():
            plain = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
            plain.weight, plain.bias = layer.weight, layer.bias  # shared, not copied
            put(name, plain)
        yield model
    finally:
        for name, layer in layers.items():
            put(name, layer)

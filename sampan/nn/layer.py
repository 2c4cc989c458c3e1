"""``sampan.nn.Layer``: a ``torch.nn.Module`` with Paddle's method names added.

Layer adds names, not behaviour: any plain ``torch.nn.Module`` works everywhere sampan takes a
model, and every sampan model is a ``torch.nn.Module`` that torch tools (compile, export, FSDP,
DTensor) accept unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from sampan.tensor import DTypeLike, to_dtype


class Layer(nn.Module):
    """Base class for sampan layers and models (a ``torch.nn.Module``)."""

    def sublayers(self, include_self: bool = False) -> list[nn.Module]:
        """All descendant layers, depth first (``include_self`` puts this layer first)."""
        layers = list(self.modules())
        return layers if include_self else layers[1:]

    def named_sublayers(self, prefix: str = "", include_self: bool = False) -> Iterator[tuple[str, nn.Module]]:
        """``(name, layer)`` for every descendant layer."""
        for name, module in self.named_modules(prefix=prefix):
            if module is self and not include_self:
                continue
            yield name, module

    def set_state_dict(self, state_dict: Mapping[str, Any], use_structured_name: bool = True):
        """Paddle's name for ``load_state_dict`` (strict: mismatched keys are errors)."""
        del use_structured_name  # structured names are the only kind torch has
        return self.load_state_dict(state_dict, strict=True)

    def create_parameter(self, shape: list[int] | tuple[int, ...], dtype: DTypeLike = None,
                         default_initializer: Any = None, is_bias: bool = False) -> nn.Parameter:
        """A new trainable parameter (zeros for biases, Xavier-uniform otherwise, as in Paddle).

        ``default_initializer`` is a callable that fills a tensor in place (e.g. ``nn.init.normal_``).
        """
        data = torch.empty(tuple(shape), dtype=to_dtype(dtype) or torch.get_default_dtype())
        if default_initializer is not None:
            default_initializer(data)
        elif is_bias or data.dim() < 2:
            nn.init.zeros_(data)
        else:
            nn.init.xavier_uniform_(data)
        return nn.Parameter(data)

    def clear_gradients(self, set_to_zero: bool = True) -> None:
        """Zero (or drop, with ``set_to_zero=False``) the gradients of all parameters."""
        self.zero_grad(set_to_none=not set_to_zero)

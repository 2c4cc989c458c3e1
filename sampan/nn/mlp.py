"""The transformer feed-forward block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sampan.nn.layer import Layer
from sampan.utils.activations import ACTIVATION_NAMES, check_activation

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
assert tuple(ACTIVATIONS) == ACTIVATION_NAMES, "sampan.utils.activations names every activation here"

__all__ = ["ACTIVATIONS", "FeedForward", "check_activation"]


class FeedForward(Layer):
    """``fc2(act(fc1(x)))``: fc1 widens to ``intermediate_size``, fc2 projects back."""

    def __init__(self, hidden_size: int, intermediate_size: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        check_activation(activation)
        self.activation = activation
        self.fc1 = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.fc2 = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))

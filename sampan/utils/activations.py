"""Names of the feed-forward activations sampan's models take (torch-free, so configs validate
without importing torch; ``sampan.nn.mlp`` holds the functions under the same names)."""

from __future__ import annotations

ACTIVATION_NAMES = ("gelu", "gelu_tanh", "relu", "silu")


def check_activation(name: str) -> None:
    """Raise a ValueError naming ``name`` and the allowed names unless it is one of them."""
    if name not in ACTIVATION_NAMES:
        raise ValueError(f"unknown activation {name!r}; allowed: {sorted(ACTIVATION_NAMES)}")

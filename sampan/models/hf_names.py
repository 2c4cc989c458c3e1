"""Names shared by the families' Hugging Face adapters (torch-free)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# HF hidden_act -> sampan activation (the gelu variants are the same functions up to rounding).
ACTIVATIONS_FROM_HF = {
    "gelu": "gelu", "gelu_python": "gelu",
    "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
    "relu": "relu", "silu": "silu", "swish": "silu",
}
# sampan activation -> the HF name written on export.
ACTIVATIONS_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


def activation_from_hf(hf_config: Mapping[str, Any], key: str, default: str) -> str:
    """The sampan activation for ``hf_config[key]``; an activation sampan lacks is an error naming it."""
    act = hf_config.get(key, default)
    if act not in ACTIVATIONS_FROM_HF:
        raise ValueError(f"{key} {act!r} is not supported; supported: {sorted(ACTIVATIONS_FROM_HF)}")
    return ACTIVATIONS_FROM_HF[act]


def head_from_architectures(hf_config: Mapping[str, Any], suffixes: Mapping[str, str]) -> str | None:
    """The head named by the first of ``architectures`` ending in one of ``suffixes`` (suffix -> head),
    longest suffix first; None when ``architectures`` is absent. An architecture no suffix
    matches is an error listing what is supported."""
    archs = hf_config.get("architectures") or []
    for arch in archs:
        for suffix in sorted(suffixes, key=len, reverse=True):
            if arch.endswith(suffix):
                return suffixes[suffix]
    if archs:
        raise ValueError(f"architectures {archs} name no head sampan has; supported: "
                         f"{', '.join('*' + s for s in suffixes)} (or pass head=)")
    return None

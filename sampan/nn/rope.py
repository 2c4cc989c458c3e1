"""Rotary position embeddings (Su et al. 2021), with linear and Llama 3.1 frequency scaling."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn


def rope_inv_freq(head_dim: int, theta: float, scaling: Mapping[str, Any] | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """The ``head_dim / 2`` rotation frequencies ``theta ** (-2i / head_dim)``, scaled as ``scaling`` says.

    ``{"rope_type": "linear", "factor": f}`` divides every frequency by ``f``. Llama 3.1's
    ``"llama3"`` scaling divides the low frequencies (wavelengths longer than
    ``original_max_position_embeddings / low_freq_factor``) by ``factor``, keeps the high ones
    (shorter than ``... / high_freq_factor``), and blends linearly in between.
    """
    # Computed in float32 from int64 exponents, as the reference implementations do, so the
    # angles match theirs to the last bit.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        original = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = original / low, original / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, blended, scaled)
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} is not supported (default, linear, llama3)")
    return inv_freq


class RotaryEmbedding(nn.Module):
    """Position ids -> the ``(cos, sin)`` tables that :func:`apply_rotary` applies to q and k.

    Holds no tensors: the frequencies are recomputed (``head_dim / 2`` numbers) on the device of
    the positions, so a model built on the meta device and materialised later, or moved, or
    sharded, never carries stale or uninitialised buffers.
    """

    def __init__(self, head_dim: int, theta: float = 10000.0, scaling: Mapping[str, Any] | None = None):
        super().__init__()
        self.head_dim, self.theta = head_dim, theta
        self.scaling = dict(scaling) if scaling else None

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``position_ids [b | 1, s]`` -> ``cos, sin [b | 1, s, head_dim]`` in ``dtype``."""
        inv_freq = rope_inv_freq(self.head_dim, self.theta, self.scaling, position_ids.device)
        # Angles in float32 even under autocast: bf16 positions above 256 lose whole radians.
        device_type = position_ids.device.type
        no_autocast = (torch.autocast(device_type=device_type, enabled=False) if device_type in ("cpu", "cuda")
                       else contextlib.nullcontext())
        with no_autocast:
            freqs = position_ids.float()[..., None] * inv_freq
            angles = torch.cat((freqs, freqs), dim=-1)
            return angles.cos().to(dtype), angles.sin().to(dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}, scaling={self.scaling}"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q, k [b, heads, s, d]`` by the angles of ``cos, sin [b | 1, s, d]`` (the half-split
    layout Hugging Face's Llama / Qwen checkpoints use, not the interleaved one)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin

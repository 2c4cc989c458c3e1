"""Rotary position embeddings (Su et al. 2021), with linear, Llama 3.1 and YaRN frequency scaling."""

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
    (shorter than ``... / high_freq_factor``), and blends linearly in between. ``"yarn"``
    (``factor``, ``original_max_position_embeddings``, optional ``beta_fast`` / ``beta_slow``) is
    YaRN's ramp between the two (see :func:`rope_attention_factor` for its temperature).
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
    if rope_type == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling, theta ** exponents)
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} is not supported (default, linear, llama3, yarn)")
    return inv_freq


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(factor) + 1`` (1 when ``factor <= 1``)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_attention_factor(scaling: Mapping[str, Any] | None) -> float:
    """What the ``cos, sin`` tables are multiplied by: 1, except for YaRN (Peng et al. 2023), whose
    ``attention_factor`` is given, or ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when
    both are given (DeepSeek), else ``mscale(factor)``."""
    if (scaling or {}).get("rope_type") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all_dim = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


def _yarn_inv_freq(dim: int, theta: float, scaling: Mapping[str, Any], pos_freqs: torch.Tensor) -> torch.Tensor:
    # YaRN: frequencies that turn more than beta_fast times over the original context keep their
    # value (extrapolation), those turning fewer than beta_slow times are divided by factor
    # (interpolation), and a linear ramp over the dimensions blends the two in between.
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a one-point ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1).to(pos_freqs.device)
    extrapolated = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated


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
        self.attention_factor = rope_attention_factor(self.scaling)

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
            cos, sin = angles.cos(), angles.sin()
            if self.attention_factor != 1.0:  # YaRN's temperature, folded into the tables
                cos, sin = cos * self.attention_factor, sin * self.attention_factor
            return cos.to(dtype), sin.to(dtype)

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

"""Layers: ``Layer`` (a ``torch.nn.Module``), transformer blocks, and gradient clipping.

Any layer torch has is available here under its torch name (``sampan.nn.Linear``,
``sampan.nn.LayerNorm``, ``sampan.nn.functional`` ...): sampan adds to torch's layers, it does not
wrap them.
"""

from __future__ import annotations

from torch import nn as _torch_nn
from torch.nn import functional

from sampan.nn.attention import MultiHeadAttention, build_attention_mask
from sampan.nn.clip import ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue
from sampan.nn.embeddings import TransformerEmbeddings
from sampan.nn.kv_cache import KVCache
from sampan.nn.layer import Layer
from sampan.nn.mlp import FeedForward
from sampan.nn.moe import MoE
from sampan.nn.moe_config import MoEConfig
from sampan.nn.transformer import TransformerBlock


def __getattr__(name: str):
    # Everything else comes straight from torch.nn, so users never hit a missing layer.
    try:
        return getattr(_torch_nn, name)
    except AttributeError:
        raise AttributeError(f"module 'sampan.nn' has no attribute {name!r} (nor does torch.nn)") from None


__all__ = [
    "ClipGradByGlobalNorm",
    "ClipGradByNorm",
    "ClipGradByValue",
    "FeedForward",
    "KVCache",
    "Layer",
    "MoE",
    "MoEConfig",
    "MultiHeadAttention",
    "TransformerBlock",
    "TransformerEmbeddings",
    "build_attention_mask",
    "functional",
]

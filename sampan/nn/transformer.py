"""One transformer layer, pre-norm (GPT) or post-norm (BERT / ERNIE)."""

from __future__ import annotations

import torch
from torch import nn

from sampan.nn.attention import MultiHeadAttention
from sampan.nn.kv_cache import KVCache
from sampan.nn.layer import Layer
from sampan.nn.mlp import FeedForward


class TransformerBlock(Layer):
    """Attention + feed-forward with residuals.

    ``pre_norm=True``: ``x + attn(norm1(x))`` then ``h + mlp(norm2(h))`` (GPT-2/3: stable when deep).
    ``pre_norm=False``: ``norm1(x + attn(x))`` then ``norm2(h + mlp(h))`` (BERT / ERNIE, so their
    checkpoints load unchanged).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        intermediate_size: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        activation: str = "gelu",
        layer_norm_eps: float = 1e-5,
        pre_norm: bool = True,
    ):
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = MultiHeadAttention(hidden_size, num_heads, dropout=attention_dropout)
        self.norm1 = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.mlp = FeedForward(hidden_size, intermediate_size, activation)
        self.norm2 = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        kv_cache: KVCache | None = None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.dropout(self.attn(self.norm1(x), attn_mask, is_causal, kv_cache, layer_idx))
            return x + self.dropout(self.mlp(self.norm2(x)))
        x = self.norm1(x + self.dropout(self.attn(x, attn_mask, is_causal, kv_cache, layer_idx)))
        return self.norm2(x + self.dropout(self.mlp(x)))

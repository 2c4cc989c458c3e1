"""Multi-head attention through ``F.scaled_dot_product_attention``, with an optional KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sampan.nn.kv_cache import KVCache
from sampan.nn.layer import Layer


def build_attention_mask(
    padding_mask: torch.Tensor | None, q_len: int, kv_len: int, causal: bool
) -> tuple[torch.Tensor | None, bool]:
    """Turn a padding mask and causality into what SDPA takes: ``(attn_mask, is_causal)``.

    ``padding_mask`` is ``[batch, kv_len]`` with 1/True where a key is real and 0 where it is
    padding. The queries are the last ``q_len`` of the ``kv_len`` positions (a KV cache holds the
    rest). Returns ``(None, True)`` when SDPA's built-in causal mask is exact, which keeps its fast
    path, ``(None, False)`` when nothing needs masking, else a boolean ``[b|1, 1, q_len, kv_len]``
    mask where True means "may attend".
    """
    past = kv_len - q_len
    if past < 0:
        raise ValueError(f"q_len ({q_len}) cannot exceed kv_len ({kv_len})")
    if padding_mask is None:
        if not causal or q_len == 1:
            return None, False
        if past == 0:
            return None, True
    if padding_mask is not None and padding_mask.shape[-1] != kv_len:
        raise ValueError(
            f"attention_mask covers {padding_mask.shape[-1]} positions but the keys span {kv_len}; "
            "with a KV cache pass the mask for past and new tokens together"
        )
    device = padding_mask.device if padding_mask is not None else None
    mask = torch.ones(1, 1, q_len, kv_len, dtype=torch.bool, device=device)
    if causal:
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=device).tril(diagonal=past)[None, None]
    if padding_mask is not None:
        mask = mask & padding_mask.bool()[:, None, None, :]
        # A query that may see nothing (a left-pad position under a causal mask) would softmax over
        # all -inf and give NaN, and NaN values leak through later layers even where masked. Let
        # such rows see every key instead: their outputs are padding and never read.
        mask = mask | ~mask.any(dim=-1, keepdim=True)
    return mask, False


def build_decoder_mask(
    padding_mask: torch.Tensor | None, segment_ids: torch.Tensor | None, seq_len: int, past: int, cached: bool
) -> tuple[torch.Tensor | None, bool]:
    """A causal decoder's ``(attn_mask, is_causal)``: block-diagonal over packed sequences when
    ``segment_ids`` are given (training and scoring only, so not with a KV cache), else causal over
    ``past`` cached positions and ``seq_len`` new ones with ``padding_mask``."""
    if segment_ids is None:
        return build_attention_mask(padding_mask, seq_len, past + seq_len, causal=True)
    if cached:
        raise ValueError("segment_ids (packed sequences) are for training and scoring, not for a KV cache")
    return build_segment_mask(segment_ids, padding_mask), False


def build_segment_mask(segment_ids: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """A block-diagonal causal mask for packed rows: ``[b, 1, s, s]`` bool, True = "may attend".

    ``segment_ids [b, s]`` numbers the sequences packed into each row (equal ids = one sequence,
    which must be contiguous); a token attends to the earlier tokens of its own sequence only, so
    several conversations share a row without seeing each other. ``padding_mask [b, s]`` (1 = real)
    also hides padding keys; a padding query then sees only itself (never NaN), and is never read.
    """
    if segment_ids.dim() != 2:
        raise ValueError(f"segment_ids must be [batch, seq_len], got shape {tuple(segment_ids.shape)}")
    s = segment_ids.shape[1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    causal = torch.ones(s, s, dtype=torch.bool, device=segment_ids.device).tril()
    mask = same & causal
    if padding_mask is not None:
        if padding_mask.shape != segment_ids.shape:
            raise ValueError(f"attention_mask shape {tuple(padding_mask.shape)} must equal segment_ids shape "
                             f"{tuple(segment_ids.shape)} in a packed batch")
        mask = mask & padding_mask.bool()[:, None, :]
        mask = mask | torch.eye(s, dtype=torch.bool, device=segment_ids.device)
    return mask[:, None]


def default_position_ids(attention_mask: torch.Tensor | None, seq_len: int, past: int,
                         device: torch.device) -> torch.Tensor:
    """Positions of the ``seq_len`` new tokens after ``past`` cached ones.

    With ``attention_mask [b, past + seq_len]`` (1 = real token) positions count each row's real
    tokens, so a left-padded prompt starts at 0 on its first real token; without it they run
    ``past .. past + seq_len - 1``.
    """
    if attention_mask is not None:
        return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -seq_len:]
    return torch.arange(past, past + seq_len, device=device)[None]


class MultiHeadAttention(Layer):
    """Self-attention with separate q/k/v projections (so tensor parallelism can split heads).

    Head count is inferred from the projection width at run time (``-1`` in the reshape), so the
    same code runs unchanged when a tensor-parallel plan shards the projections by heads.
    """

    def __init__(self, hidden_size: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
        self.head_dim = hidden_size // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, -1, self.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        kv_cache: KVCache | None = None,
        layer_idx: int = 0,
    ) -> torch.Tensor:
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        if kv_cache is not None:
            k, v = kv_cache.update(layer_idx, k, v)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0,
        )
        b, _, s, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, s, -1))

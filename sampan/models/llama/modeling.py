"""Llama-style decoders: Llama 2 / 3 / 3.1, Qwen2 / Qwen2.5 and Qwen3 in one model.

Pre-norm layers of grouped-query attention (RoPE; optional q / k / v bias and per-head q / k
RMSNorm) and a SwiGLU MLP. Module names follow Hugging Face's (``model.layers.0.self_attn.q_proj``),
so checkpoints and peft adapters carry the same tensor names. No parallelism lives here: the
tensor-parallel, sequence-parallel and pipeline splits are declared in ``parallelize.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sampan.models.generation import GenerationMixin
from sampan.models.init import init_transformer_weights
from sampan.models.llama.config import LlamaConfig
from sampan.models.losses import next_token_count, next_token_loss
from sampan.models.pretrained import PretrainedModel
from sampan.nn import KVCache, Layer
from sampan.nn.attention import build_decoder_mask, default_position_ids
from sampan.nn.mlp import ACTIVATIONS
from sampan.nn.rms_norm import RMSNorm
from sampan.nn.rope import RotaryEmbedding, apply_rotary


class LlamaAttention(Layer):
    """Grouped-query self-attention through ``scaled_dot_product_attention``.

    Heads are inferred from the projections' width at run time, so a tensor-parallel split of
    the projections by heads runs this code unchanged; the KV cache holds only the KV heads.
    """

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.head_dim = d
        self.dropout = config.attention_dropout
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=config.qkv_bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.qkv_bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=config.out_bias)
        self.q_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps) if config.qk_norm else None
        self.rotary = RotaryEmbedding(d, config.rope_theta, config.rope_scaling)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        kv_cache: KVCache | None = None,
        layer_idx: int = 0,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``x [b, s, h]``; ``position_embeddings`` are the rotary ``(cos, sin)``, computed for
        positions after the cache when omitted (a pipeline stage runs layers on their own)."""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim)
        k = self.k_proj(x).view(b, s, -1, self.head_dim)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        if position_embeddings is None:
            past = kv_cache.seq_len(layer_idx) if kv_cache is not None else 0
            position_embeddings = self.rotary(torch.arange(past, past + s, device=x.device)[None], x.dtype)
        q, k = apply_rotary(q, k, *position_embeddings)
        if kv_cache is not None:
            k, v = kv_cache.update(layer_idx, k, v)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=is_causal,
            dropout_p=self.dropout if self.training else 0.0, enable_gqa=q.shape[1] != k.shape[1],
        )
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class LlamaMLP(Layer):
    """SwiGLU: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h, f = config.hidden_size, config.intermediate_size
        self.activation = config.activation
        self.gate_proj = nn.Linear(h, f, bias=config.mlp_bias)
        self.up_proj = nn.Linear(h, f, bias=config.mlp_bias)
        self.down_proj = nn.Linear(f, h, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ACTIVATIONS[self.activation](self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(Layer):
    """``x + attn(norm(x))`` then ``h + mlp(norm(h))``."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self,
        x: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        kv_cache: KVCache | None = None,
        layer_idx: int = 0,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), attn_mask, is_causal, kv_cache, layer_idx,
                               position_embeddings)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(Layer, PretrainedModel):
    """Token embeddings, ``num_layers`` decoder layers and a final RMSNorm; returns hidden states."""

    config_class = LlamaConfig
    head = "none"

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        init_transformer_weights(self, config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``input_ids [b, s]`` -> hidden states ``[b, s, h]``.

        ``attention_mask [b, past + s]`` marks real tokens (1) and padding (0); with left padding
        the positions are counted from each row's first real token. ``kv_cache`` holds the keys
        and values of earlier calls, so a decoding step only feeds the newest token. Without a
        padding mask attention takes SDPA's causal (flash) path. ``segment_ids [b, s]`` marks
        packed sequences (``build_segment_mask``): attention stays inside each one; give
        ``position_ids`` restarting at 0 per sequence with it.
        """
        seq_len = input_ids.shape[1]
        past = kv_cache.seq_len() if kv_cache is not None else 0
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, seq_len, past, input_ids.device)
        mask, is_causal = build_decoder_mask(attention_mask, segment_ids, seq_len, past, kv_cache is not None)
        x = self.embed_tokens(input_ids)
        rotary = self.rotary(position_ids, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, is_causal, kv_cache, i, rotary)
        return self.norm(x)


class LlamaForCausalLM(Layer, PretrainedModel, GenerationMixin):
    """The decoder with a language-model head (tied to the embedding when the config says) and ``generate``."""

    config_class = LlamaConfig
    head = "causal_lm"

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.tie_weights()
        else:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=config.initializer_range)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``[b, s, vocab]``, or with ``labels`` the mean next-token loss.

        ``labels`` are aligned with ``input_ids`` (usually a copy of them); the model shifts them
        so position ``t`` predicts token ``t + 1``. Label -100 is ignored. ``segment_ids`` packs
        several sequences into a row (see ``LlamaModel.forward``); each one's first label must be
        -100, so no sequence predicts the next one's first token.
        """
        hidden = self.model(input_ids, attention_mask, position_ids, kv_cache, segment_ids)
        if labels is None:
            return self.lm_head(hidden)
        return next_token_loss(self.lm_head, hidden, labels, input_ids)

    loss_token_count = staticmethod(next_token_count)

"""ERNIE 4.5 decoders, dense and Mixture-of-Experts, in one model.

Pre-norm layers of grouped-query attention (RoPE on *interleaved* pairs: dimensions ``2i`` and
``2i + 1`` of a head rotate together, where Llama rotates ``i`` with ``i + d/2``) and an MLP that
is a SwiGLU on dense layers and a ``sampan.nn.MoE`` block on MoE layers. Module names follow
Hugging Face's (``model.layers.1.mlp.experts``), so checkpoints map by name. No parallelism lives
here: ``parallelize.py`` declares the splits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sampan.models.ernie4_5.config import Ernie4_5Config
from sampan.models.generation import GenerationMixin
from sampan.models.init import init_transformer_weights
from sampan.models.losses import next_token_count, next_token_loss
from sampan.models.pretrained import PretrainedModel
from sampan.nn import KVCache, Layer
from sampan.nn.attention import build_decoder_mask, default_position_ids
from sampan.nn.mlp import ACTIVATIONS
from sampan.nn.moe import MoE
from sampan.nn.moe_config import MoEConfig
from sampan.nn.rms_norm import RMSNorm
from sampan.nn.rope import RotaryEmbedding


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """``(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)``: each interleaved pair turned a quarter."""
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def apply_interleaved_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q, k [b, heads, s, d]`` pairwise by the angles of ``cos, sin [b | 1, s, d]``.

    The tables are ``sampan.nn.RotaryEmbedding``'s (angle ``i`` at columns ``i`` and ``i + d/2``),
    so a pipeline or context-parallel stage hands this model the same tables as a Llama; here
    angle ``i`` is spread over columns ``2i`` and ``2i + 1``. Computed in float32 and cast back,
    as ERNIE 4.5 (and transformers' port) does.
    """
    half = cos.shape[-1] // 2
    cos = cos[..., :half].float().repeat_interleave(2, dim=-1).unsqueeze(1)
    sin = sin[..., :half].float().repeat_interleave(2, dim=-1).unsqueeze(1)
    q_out = q.float() * cos + _rotate_pairs(q.float()) * sin
    k_out = k.float() * cos + _rotate_pairs(k.float()) * sin
    return q_out.to(q.dtype), k_out.to(k.dtype)


def moe_config(config: Ernie4_5Config) -> MoEConfig:
    """The ``sampan.nn.MoEConfig`` of ``config``'s MoE layers: softmax over all experts, top-k
    chosen on the scores plus the correction bias, the chosen scores renormalised with the floor
    ``moe_norm_min``, shared experts added unweighted."""
    return MoEConfig(
        hidden_size=config.hidden_size,
        num_experts=config.moe_num_experts,
        top_k=config.moe_k,
        expert_intermediate_size=config.moe_intermediate_size,
        activation=config.activation,
        shared_intermediate_size=config.shared_intermediate_size,
        score_func="softmax",
        norm_topk_prob=True,
        norm_min=config.moe_norm_min,
        score_correction_bias=True,
        bias_update_rate=config.moe_bias_update_rate,
        aux_loss=config.moe_aux_loss,
        aux_loss_coef=config.router_aux_loss_coef,
        capacity_factor=config.moe_capacity_factor,
    )


class Ernie4_5Attention(Layer):
    """Grouped-query self-attention with interleaved RoPE, through ``scaled_dot_product_attention``.

    Heads are inferred from the projections' width at run time, so a tensor-parallel split by
    heads runs this code unchanged; the KV cache holds only the KV heads.
    """

    def __init__(self, config: Ernie4_5Config):
        super().__init__()
        h, d, bias = config.hidden_size, config.head_dim, config.use_bias
        self.head_dim = d
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=bias)
        self.rotary = RotaryEmbedding(d, config.rope_theta)

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
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        if position_embeddings is None:
            past = kv_cache.seq_len(layer_idx) if kv_cache is not None else 0
            position_embeddings = self.rotary(torch.arange(past, past + s, device=x.device)[None], torch.float32)
        q, k = apply_interleaved_rotary(q, k, *position_embeddings)
        if kv_cache is not None:
            k, v = kv_cache.update(layer_idx, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class Ernie4_5MLP(Layer):
    """The dense layers' SwiGLU: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, config: Ernie4_5Config):
        super().__init__()
        h, f, bias = config.hidden_size, config.intermediate_size, config.use_bias
        self.activation = config.activation
        self.gate_proj = nn.Linear(h, f, bias=bias)
        self.up_proj = nn.Linear(h, f, bias=bias)
        self.down_proj = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(ACTIVATIONS[self.activation](self.gate_proj(x)) * self.up_proj(x))


class Ernie4_5DecoderLayer(Layer):
    """``x + attn(norm(x))`` then ``h + mlp(norm(h))``; ``mlp`` is an ``MoE`` on MoE layers."""

    def __init__(self, config: Ernie4_5Config, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Ernie4_5Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(moe_config(config)) if layer_idx in config.moe_layers else Ernie4_5MLP(config)

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


def _init_weights(model: nn.Module, std: float) -> None:
    """Normal(0, std) for every weight (routers and experts too, as transformers initialises
    them), zeros for biases and the routers' score-correction bias, ones for norms."""
    init_transformer_weights(model, std)
    for module in model.modules():
        if isinstance(module, MoE):
            module.reset_parameters(std)


class Ernie4_5Model(Layer, PretrainedModel):
    """Token embeddings, ``num_layers`` decoder layers and a final RMSNorm; returns hidden states."""

    config_class = Ernie4_5Config
    head = "none"

    def __init__(self, config: Ernie4_5Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(Ernie4_5DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        _init_weights(self, config.initializer_range)

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
        positions count from each row's first real token. ``kv_cache`` holds earlier calls' keys
        and values. ``segment_ids [b, s]`` marks packed sequences (attention stays inside each);
        give ``position_ids`` restarting at 0 per sequence with it.
        """
        seq_len = input_ids.shape[1]
        past = kv_cache.seq_len() if kv_cache is not None else 0
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, seq_len, past, input_ids.device)
        mask, is_causal = build_decoder_mask(attention_mask, segment_ids, seq_len, past, kv_cache is not None)
        x = self.embed_tokens(input_ids)
        # float32 tables: the rotation runs in float32 whatever the activations' dtype.
        rotary = self.rotary(position_ids, torch.float32)
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, is_causal, kv_cache, i, rotary)
        return self.norm(x)


class Ernie4_5ForCausalLM(Layer, PretrainedModel, GenerationMixin):
    """The decoder with a language-model head (tied to the embedding when the config says) and ``generate``."""

    config_class = Ernie4_5Config
    head = "causal_lm"

    def __init__(self, config: Ernie4_5Config):
        super().__init__()
        self.config = config
        self.model = Ernie4_5Model(config)
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

        ``labels`` are aligned with ``input_ids`` (the model shifts them); -100 is ignored. An MoE
        model's balancing loss (``moe_aux_loss``) is not added here: it reaches the router's
        gradients inside each MoE block, so this loss stays the plain language-model loss.
        """
        hidden = self.model(input_ids, attention_mask, position_ids, kv_cache, segment_ids)
        if labels is None:
            return self.lm_head(hidden)
        return next_token_loss(self.lm_head, hidden, labels, input_ids)

    loss_token_count = staticmethod(next_token_count)

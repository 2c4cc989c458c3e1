"""Qwen2-MoE and Qwen3-MoE decoders: the Llama family's attention with Mixture-of-Experts MLPs.

Each layer is Llama's pre-norm layer (``LlamaAttention``: grouped-query attention with RoPE, and
Qwen2's q / k / v bias or Qwen3's per-head q / k RMSNorm); its ``mlp`` is a ``sampan.nn.MoE``
(softmax top-k router, grouped experts, Qwen2-MoE's gated shared expert) on the MoE layers and
Llama's SwiGLU ``LlamaMLP`` on the dense ones. Module names follow Hugging Face's, the experts
the MoE block's fused ``experts.gate_up_proj`` / ``experts.down_proj`` (``hf.py`` maps
per-expert checkpoints onto them). No parallelism lives here: ``parallelize.py`` declares it.
"""

from __future__ import annotations

import torch
from torch import nn

from sampan.models.generation import GenerationMixin
from sampan.models.init import init_transformer_weights
from sampan.models.llama.modeling import LlamaAttention, LlamaDecoderLayer, LlamaMLP
from sampan.models.losses import next_token_count, next_token_loss
from sampan.models.pretrained import PretrainedModel
from sampan.models.qwen_moe.config import QwenMoeConfig
from sampan.nn import KVCache, Layer
from sampan.nn.attention import build_decoder_mask, default_position_ids
from sampan.nn.moe import MoE
from sampan.nn.moe_config import MoEConfig
from sampan.nn.rms_norm import RMSNorm
from sampan.nn.rope import RotaryEmbedding


class QwenMoeDecoderLayer(LlamaDecoderLayer):
    """Llama's ``x + attn(norm(x))`` then ``h + mlp(norm(h))`` (its ``forward``), where ``mlp`` is
    an MoE block on the layers ``config.is_moe_layer`` names and a dense SwiGLU elsewhere."""

    def __init__(self, config: QwenMoeConfig, layer_idx: int):
        # Not LlamaDecoderLayer.__init__: that would build a dense MLP only to throw it away.
        Layer.__init__(self)
        llama = config.as_llama()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(llama)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MoE(MoEConfig(**config.moe_config_fields())) if config.is_moe_layer(layer_idx) else LlamaMLP(llama)


class QwenMoeModel(Layer, PretrainedModel):
    """Token embeddings, ``num_layers`` decoder layers and a final RMSNorm; returns hidden states."""

    config_class = QwenMoeConfig
    head = "none"

    def __init__(self, config: QwenMoeConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.layers = nn.ModuleList(QwenMoeDecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        init_transformer_weights(self, config.initializer_range)
        for layer in self.layers:  # the router and stacked experts are plain parameters, not Linear
            if isinstance(layer.mlp, MoE):
                layer.mlp.reset_parameters(config.initializer_range)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        segment_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``input_ids [b, s]`` -> hidden states ``[b, s, h]``; the arguments are
        ``LlamaModel.forward``'s (padding mask with left padding, KV cache, packed
        ``segment_ids`` with per-sequence ``position_ids``).

        Padded positions go through the router too (their outputs are discarded, as in
        transformers); in training they count in the expert loads and the balancing loss, so
        pack sequences (``segment_ids``) rather than pad them.
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


class QwenMoeForCausalLM(Layer, PretrainedModel, GenerationMixin):
    """The decoder with a language-model head (tied to the embedding when the config says) and ``generate``.

    Training needs no extra loss term: each MoE block adds its load-balancing loss's gradient in
    backward (``sampan.nn.MoE``), weighted by ``router_aux_loss_coef``.
    """

    config_class = QwenMoeConfig
    head = "causal_lm"

    def __init__(self, config: QwenMoeConfig):
        super().__init__()
        self.config = config
        self.model = QwenMoeModel(config)
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
        """Logits ``[b, s, vocab]``, or with ``labels`` the mean next-token loss (label -100 is
        ignored; ``labels`` aligned with ``input_ids``, shifted here), as ``LlamaForCausalLM``."""
        hidden = self.model(input_ids, attention_mask, position_ids, kv_cache, segment_ids)
        if labels is None:
            return self.lm_head(hidden)
        return next_token_loss(self.lm_head, hidden, labels, input_ids)

    loss_token_count = staticmethod(next_token_count)

"""GPT: a decoder-only causal language model built from ``sampan.nn`` blocks.

No parallelism lives here: tensor-parallel plans and pipeline split points are declared beside
the model and applied by ``sampan.distributed``.
"""

from __future__ import annotations

import torch
from torch import nn

from sampan.models.generation import GenerationMixin
from sampan.models.gpt.config import GPTConfig
from sampan.models.init import init_transformer_weights
from sampan.models.losses import next_token_count, next_token_loss
from sampan.models.pretrained import PretrainedModel
from sampan.nn import KVCache, Layer, TransformerBlock, TransformerEmbeddings
from sampan.nn.attention import build_decoder_mask, default_position_ids


class GPTModel(Layer, PretrainedModel):
    """Embeddings, ``num_layers`` pre-norm blocks and a final LayerNorm; returns hidden states."""

    config_class = GPTConfig
    head = "none"

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.embeddings = TransformerEmbeddings(
            config.vocab_size, config.hidden_size, config.max_position_embeddings, dropout=config.dropout
        )
        self.layers = nn.ModuleList(
            TransformerBlock(
                config.hidden_size, config.num_heads, config.intermediate_size,
                dropout=config.dropout, attention_dropout=config.attention_dropout,
                activation=config.activation, layer_norm_eps=config.layer_norm_eps, pre_norm=True,
            )
            for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        init_transformer_weights(self, config.initializer_range, config.num_layers)

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
        and values of earlier calls, so a decoding step only feeds the newest token.
        ``segment_ids [b, s]`` marks packed sequences: attention stays inside each one
        (``build_segment_mask``); give ``position_ids`` restarting at 0 per sequence with it.
        """
        seq_len = input_ids.shape[1]
        past = kv_cache.seq_len() if kv_cache is not None else 0
        if position_ids is None:
            position_ids = default_position_ids(attention_mask, seq_len, past, input_ids.device)
        if past + seq_len > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {past + seq_len} exceeds max_position_embeddings "
                f"({self.config.max_position_embeddings})"
            )
        mask, is_causal = build_decoder_mask(attention_mask, segment_ids, seq_len, past, kv_cache is not None)
        x = self.embeddings(input_ids, position_ids=position_ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, is_causal, kv_cache, i)
        return self.norm(x)


class GPTForCausalLM(Layer, PretrainedModel, GenerationMixin):
    """GPT with a language-model head (tied to the input embedding by default) and ``generate``."""

    config_class = GPTConfig
    head = "causal_lm"

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.gpt = GPTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.tie_weights()
        else:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=config.initializer_range)

    def tie_weights(self) -> None:
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.gpt.embeddings.word_embeddings.weight

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
        several sequences into a row (see ``GPTModel.forward``); each one's first label must be -100.
        """
        hidden = self.gpt(input_ids, attention_mask, position_ids, kv_cache, segment_ids)
        if labels is None:
            return self.lm_head(hidden)
        return next_token_loss(self.lm_head, hidden, labels, input_ids)

    # How many terms the loss averages: data-parallel and accumulated steps weight each part's mean
    # loss by it, so the result is the mean over all tokens of the global batch.
    loss_token_count = staticmethod(next_token_count)

"""Token embeddings: words + positions (+ token types) (+ task types) (+ pinyin / radical / stroke features)."""

from __future__ import annotations

import torch
from torch import nn

from sampan.nn.layer import Layer

# Optional Chinese character features, each an extra embedding summed into the word embedding.
FEATURES = ("pinyin", "radical", "stroke")


class TransformerEmbeddings(Layer):
    """Sum of word, learned absolute position, token-type, task-type and optional character-feature
    embeddings.

    A feature whose vocabulary size is 0 is absent (no parameters). Task types are ERNIE 3.0's
    (``task_type_ids``; row 0 when none are given, as in its checkpoints). Chinese feature ids
    (pinyin, radical, stroke count per character) come from ``sampan.text`` at data-build time.
    """

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        max_position_embeddings: int,
        type_vocab_size: int = 0,
        pinyin_vocab_size: int = 0,
        radical_vocab_size: int = 0,
        stroke_vocab_size: int = 0,
        layer_norm_eps: float | None = None,
        task_type_vocab_size: int = 0,
        dropout: float = 0.0,
        padding_idx: int | None = None,
    ):
        super().__init__()
        self.max_position_embeddings = max_position_embeddings
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size, padding_idx=padding_idx)
        self.position_embeddings = nn.Embedding(max_position_embeddings, hidden_size)
        self.token_type_embeddings = nn.Embedding(type_vocab_size, hidden_size) if type_vocab_size else None
        self.task_type_embeddings = nn.Embedding(task_type_vocab_size, hidden_size) if task_type_vocab_size else None
        sizes = {"pinyin": pinyin_vocab_size, "radical": radical_vocab_size, "stroke": stroke_vocab_size}
        self.feature_embeddings = nn.ModuleDict(
            {name: nn.Embedding(size, hidden_size) for name, size in sizes.items() if size}
        )
        self.norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps) if layer_norm_eps is not None else None
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        features: dict[str, torch.Tensor] | None = None,
        task_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        seq_len = input_ids.shape[1]
        if position_ids is None:
            if seq_len > self.max_position_embeddings:
                raise ValueError(
                    f"sequence length {seq_len} exceeds max_position_embeddings "
                    f"({self.max_position_embeddings}); truncate the input or use a longer config"
                )
            position_ids = torch.arange(seq_len, device=input_ids.device)[None]
        x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            x = x + self.token_type_embeddings(token_type_ids)
        if self.task_type_embeddings is not None:
            if task_type_ids is None:
                task_type_ids = torch.zeros_like(input_ids)
            x = x + self.task_type_embeddings(task_type_ids)
        elif task_type_ids is not None:
            raise ValueError("task_type_ids were passed but the model has no task-type embeddings "
                             "(config task_type_vocab_size = 0)")
        features = features or {}
        unknown = set(features) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown feature ids {sorted(unknown)}; allowed: {list(FEATURES)}")
        for name, table in self.feature_embeddings.items():
            ids = features.get(name)
            if ids is None:
                raise ValueError(
                    f"this model has {name} embeddings (config {name}_vocab_size > 0) but no "
                    f"{name}_ids were passed; build them with sampan.text or disable the feature"
                )
            x = x + table(ids)
        for name, ids in features.items():
            if ids is not None and name not in self.feature_embeddings:
                raise ValueError(f"{name}_ids were passed but the config has {name}_vocab_size = 0")
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)

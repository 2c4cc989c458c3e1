"""ERNIE (BERT-style encoder) configuration."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from sampan.models.config_base import ModelConfig
from sampan.utils.activations import check_activation


@dataclasses.dataclass
class ErnieConfig(ModelConfig):
    """A bidirectional encoder (BERT / ERNIE 1.0 layout, post-norm) with optional Chinese features.

    Fields:
        vocab_size: number of token ids (21128 for the bert-base-chinese vocabulary).
        hidden_size: model width ``h``.
        num_layers: number of transformer blocks ``L``.
        num_heads: attention heads; must divide ``hidden_size``.
        intermediate_size: feed-forward width; 0 means ``4 * hidden_size``.
        max_position_embeddings: longest input sequence.
        type_vocab_size: number of segment (token type) ids; 0 disables them.
        task_type_vocab_size: number of ERNIE 3.0 task-type ids (3 in its checkpoints); 0 disables them.
        pinyin_vocab_size / radical_vocab_size / stroke_vocab_size: sizes of the optional
            per-character pinyin, radical and stroke-count embeddings; 0 disables each.
        dropout: dropout on embeddings and residual branches.
        attention_dropout: dropout on attention probabilities.
        activation: feed-forward activation ("gelu", "gelu_tanh", "relu", "silu").
        layer_norm_eps: LayerNorm epsilon (1e-12 as in BERT).
        initializer_range: std of the normal init.
        pad_token_id: id of [PAD]; when no attention_mask is given, positions holding it are masked.
        num_labels: classes of the sequence / token classification heads.
        classifier_dropout: dropout before the classifiers (None: use ``dropout``).
        classifier_pooling: how the sequence classifier reduces the tokens to one vector:
            "cls" (BERT's tanh pooler over [CLS]) or "mean" (the mean of the last hidden states
            over the real tokens, no pooler). The pooler is trained by next-sentence prediction
            in BERT; a base pretrained by MLM alone leaves it random and [CLS] has learned
            nothing to summarise, so "mean" starts fine-tuning from every token's features.
        pre_norm: normalise before each residual branch and once after the last block (GPT-2
            style) instead of after each residual sum (BERT / ERNIE 1.0). Post-norm is the default
            so BERT checkpoints load unchanged; pre-norm leaves the unigram plateau of MLM
            pretraining sooner, which matters when a pretraining run is short (the store's
            ernie-tiny-zh is pretrained on 2 CPU cores).
    """

    vocab_size: int = 21128
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 0
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    task_type_vocab_size: int = 0
    pinyin_vocab_size: int = 0
    radical_vocab_size: int = 0
    stroke_vocab_size: int = 0
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation: str = "gelu"
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int | None = 0
    num_labels: int = 2
    classifier_dropout: float | None = None
    classifier_pooling: str = "cls"
    pre_norm: bool = False

    model_type: ClassVar[str] = "ernie"
    HEADS: ClassVar[tuple[str, ...]] = ("masked_lm", "none", "sequence_classification", "token_classification")

    def __post_init__(self) -> None:
        self._positive("vocab_size", "hidden_size", "num_layers", "num_heads", "max_position_embeddings",
                       "num_labels")
        self._non_negative("intermediate_size", "type_vocab_size", "task_type_vocab_size", "pinyin_vocab_size",
                           "radical_vocab_size", "stroke_vocab_size")
        self._divisible("hidden_size", "num_heads")
        self._probability("dropout", "attention_dropout")
        if self.classifier_dropout is not None:
            self._probability("classifier_dropout")
        check_activation(self.activation)
        if self.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"ErnieConfig.classifier_pooling must be 'cls' or 'mean', got {self.classifier_pooling!r}")
        if self.intermediate_size == 0:
            self.intermediate_size = 4 * self.hidden_size
        self._positive_float("layer_norm_eps")
        self._positive_float("initializer_range", allow_zero=True)
        self._token_id("pad_token_id")

    @property
    def num_kv_heads(self) -> int:
        """Key / value heads: as many as query heads (multi-head attention)."""
        return self.num_heads

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_heads

    def _encoder_parameters(self) -> int:
        h, f = self.hidden_size, self.intermediate_size
        embedding_rows = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size
                          + self.task_type_vocab_size + self.pinyin_vocab_size + self.radical_vocab_size
                          + self.stroke_vocab_size)
        layer = 4 * (h * h + h) + (h * f + f + f * h + h) + 2 * 2 * h
        final_norm = 2 * h if self.pre_norm else 0
        return embedding_rows * h + 2 * h + self.num_layers * layer + final_norm

    def num_parameters(self, head: str | None = None) -> int:
        """Exact parameter count of the model ``create`` builds for ``head`` (default "masked_lm").

        "none" is the bare encoder with its pooler (what bert-base-chinese's ``BertModel`` holds);
        the MLM head adds a transform layer and an output bias (its weight is tied to the input
        embedding); the token classifier, like BERT's, has no pooler, nor has the sequence
        classifier with ``classifier_pooling="mean"``.
        """
        head = self._check_head(head)
        h = self.hidden_size
        pooler = h * h + h
        encoder = self._encoder_parameters()
        if head == "none":
            return encoder + pooler
        if head == "masked_lm":
            return encoder + (h * h + h) + 2 * h + self.vocab_size
        classifier = h * self.num_labels + self.num_labels
        if head == "sequence_classification":
            return encoder + (pooler if self.classifier_pooling == "cls" else 0) + classifier
        return encoder + classifier

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token for MLM pretraining at ``seq_len``: ``6 N + 12 L h s``.

        ``N`` is the non-embedding parameter count plus the tied output layer's ``V h`` (counted
        as if every position were predicted; real MLM predicts ~15%, so this is an upper bound).
        See ``GPTConfig.flops_per_token`` for the attention term.
        """
        if seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len}")
        h, L = self.hidden_size, self.num_layers
        embedding_rows = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size
                          + self.task_type_vocab_size + self.pinyin_vocab_size + self.radical_vocab_size
                          + self.stroke_vocab_size)
        n = self.num_parameters("masked_lm") - embedding_rows * h + self.vocab_size * h
        return 6 * n + 12 * L * h * seq_len


# ERNIE shapes follow BERT-Chinese (vocab 21128); ernie-tiny is sized for CPU training.
CONFIGS = {
    "ernie-tiny": ErnieConfig(hidden_size=256, num_layers=4, num_heads=4),
    # ERNIE 3.0 Mini's shape (PaddleNLP ernie-3.0-mini-zh: 6 layers, 384 wide, 12 heads, FFN 1536);
    # the store's ernie-mini-zh pretrains it on CPU with its own 6,000-token vocabulary.
    "ernie-mini": ErnieConfig(hidden_size=384, num_layers=6, num_heads=12, intermediate_size=1536),
    "ernie-base": ErnieConfig(),
    "ernie-large": ErnieConfig(hidden_size=1024, num_layers=24, num_heads=16),
}

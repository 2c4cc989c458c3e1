"""GPT configuration."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from sampan.models.config_base import ModelConfig
from sampan.utils.activations import check_activation


@dataclasses.dataclass
class GPTConfig(ModelConfig):
    """A decoder-only causal language model (GPT-2 / GPT-3 layout, pre-norm, learned positions).

    Fields:
        vocab_size: number of token ids.
        hidden_size: model width ``h``.
        num_layers: number of transformer blocks ``L``.
        num_heads: attention heads; must divide ``hidden_size``.
        intermediate_size: feed-forward width; 0 means ``4 * hidden_size``.
        max_position_embeddings: longest sequence (prompt + generated tokens).
        dropout: dropout on embeddings and residual branches.
        attention_dropout: dropout on attention probabilities.
        activation: feed-forward activation ("gelu", "gelu_tanh", "relu", "silu").
        layer_norm_eps: LayerNorm epsilon.
        tie_word_embeddings: share the LM head with the input embedding (as GPT-2/3 do).
        initializer_range: std of the normal init; residual output projections use
            ``initializer_range / sqrt(2 * num_layers)`` (GPT-2) so deep models start stable.
        bos_token_id / eos_token_id / pad_token_id: special ids (None when the vocab has none).
    """

    vocab_size: int = 50257
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 0
    max_position_embeddings: int = 1024
    dropout: float = 0.0
    attention_dropout: float = 0.0
    activation: str = "gelu_tanh"
    layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None

    model_type: ClassVar[str] = "gpt"
    HEADS: ClassVar[tuple[str, ...]] = ("causal_lm", "none")

    def __post_init__(self) -> None:
        self._positive("vocab_size", "hidden_size", "num_layers", "num_heads", "max_position_embeddings")
        self._non_negative("intermediate_size")
        self._divisible("hidden_size", "num_heads")
        self._probability("dropout", "attention_dropout")
        check_activation(self.activation)
        if self.intermediate_size == 0:
            self.intermediate_size = 4 * self.hidden_size
        self._positive_float("layer_norm_eps")
        self._positive_float("initializer_range", allow_zero=True)
        self._token_id("bos_token_id", "eos_token_id", "pad_token_id")

    @property
    def num_kv_heads(self) -> int:
        """Key / value heads: as many as query heads (multi-head attention)."""
        return self.num_heads

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_heads

    def num_parameters(self, head: str | None = None) -> int:
        """Exact parameter count of the model ``create`` builds for ``head`` (default "causal_lm")."""
        head = self._check_head(head)
        h, f, V = self.hidden_size, self.intermediate_size, self.vocab_size
        embeddings = V * h + self.max_position_embeddings * h
        attention = 4 * (h * h + h)
        mlp = h * f + f + f * h + h
        norms = 2 * 2 * h
        total = embeddings + self.num_layers * (attention + mlp + norms) + 2 * h
        if head == "causal_lm" and not self.tie_word_embeddings:
            total += V * h
        return total

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward) at ``seq_len``: ``6 N + 12 L h s``.

        ``N`` counts the parameters that take part in a matmul for every token: all parameters
        except the embedding tables (a lookup costs no FLOPs), plus the LM head's ``V h``, which
        multiplies on every token whether or not it is tied. ``12 L h s`` is the attention
        scores and weighted sum (``QK^T`` and ``AV``: ``2 * 2 L h s`` forward, three times that with
        the backward pass), counted over the full ``s x s`` square as PaLM and Megatron do for MFU.
        """
        if seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len}")
        h, L, V = self.hidden_size, self.num_layers, self.vocab_size
        n = self.num_parameters("none") - V * h - self.max_position_embeddings * h + V * h
        return 6 * n + 12 * L * h * seq_len


# GPT shapes follow GPT-2 (small) and GPT-3 (Brown et al. 2020, table 2.1; 1.3B with 16 heads as in
# Megatron); gpt-100b is a 100B-class shape (80 layers x 10240) between 13B and 175B.
CONFIGS = {
    "gpt-tiny": GPTConfig(vocab_size=8192, hidden_size=128, num_layers=4, num_heads=4, max_position_embeddings=256),
    "gpt-small": GPTConfig(),
    "gpt-medium": GPTConfig(hidden_size=1024, num_layers=24, num_heads=16),
    "gpt-1.3b": GPTConfig(hidden_size=2048, num_layers=24, num_heads=16, max_position_embeddings=2048),
    "gpt-13b": GPTConfig(hidden_size=5120, num_layers=40, num_heads=40, max_position_embeddings=2048),
    "gpt-100b": GPTConfig(hidden_size=10240, num_layers=80, num_heads=80, max_position_embeddings=2048),
    "gpt-175b": GPTConfig(hidden_size=12288, num_layers=96, num_heads=96, max_position_embeddings=2048),
}

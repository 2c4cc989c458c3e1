"""Llama-style decoder configuration (Llama 2 / 3 / 3.1, Qwen2 / Qwen2.5, Qwen3), torch-free."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sampan.models.config_base import ModelConfig
from sampan.utils.activations import check_activation

VARIANTS = ("llama", "qwen2", "qwen3")
# rope_scaling["rope_type"] -> the keys it needs besides rope_type.
ROPE_TYPES = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


@dataclasses.dataclass
class LlamaConfig(ModelConfig):
    """A pre-norm decoder with RMSNorm, rotary positions, grouped-query attention and a SwiGLU MLP.

    Fields:
        vocab_size: number of token ids.
        hidden_size: model width ``h``.
        num_layers: number of decoder layers ``L``.
        num_heads: query heads ``H``.
        num_kv_heads: key / value heads (grouped-query attention); must divide ``num_heads``; 0
            means ``num_heads`` (plain multi-head attention, as in Llama 2 7B).
        head_dim: width of one head; 0 means ``hidden_size // num_heads``. Qwen3 sets it
            explicitly (``H * head_dim`` need not equal ``h``).
        intermediate_size: SwiGLU width (gate and up projections).
        max_position_embeddings: longest sequence the positions were trained for (prompt +
            generated tokens).
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base.
        rope_scaling: None, or ``{"rope_type": "linear", "factor": f}``, or Llama 3.1's
            ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
            "original_max_position_embeddings"}``.
        qkv_bias: bias on the q / k / v projections (Qwen2 / Qwen2.5).
        out_bias: bias on the attention output projection.
        mlp_bias: bias on the three MLP projections.
        qk_norm: RMSNorm over each head of q and k before RoPE (Qwen3).
        tie_word_embeddings: share the LM head with the input embedding (small Qwen models).
        attention_dropout: dropout on attention probabilities (0 in every published model).
        activation: the gate's activation ("silu" in every published model).
        initializer_range: std of the normal init of linear and embedding weights.
        bos_token_id / pad_token_id: special ids (None when absent).
        eos_token_id: the id (or ids: Llama 3.1 lists three) that end generation.
        variant: which published architecture this is, "llama", "qwen2" or "qwen3"; it names the
            Hugging Face ``model_type`` on export, which checks that the bias / qk-norm fields
            match that architecture.
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    num_layers: int = 32
    num_heads: int = 32
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 11008
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    attention_dropout: float = 0.0
    activation: str = "silu"
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    variant: str = "llama"

    model_type: ClassVar[str] = "llama"
    HEADS: ClassVar[tuple[str, ...]] = ("causal_lm", "none")
    gated_mlp = True
    norm_kind = "rmsnorm"

    @property
    def position_table_rows(self) -> int:
        """Rotary positions: no table."""
        return 0

    def __post_init__(self) -> None:
        self._positive("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                       "max_position_embeddings")
        self._non_negative("num_kv_heads", "head_dim")
        if self.num_kv_heads == 0:
            self.num_kv_heads = self.num_heads
        if self.num_heads % self.num_kv_heads:
            divisors = [d for d in range(1, self.num_heads + 1) if self.num_heads % d == 0]
            raise ValueError(f"LlamaConfig.num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                             f"({self.num_heads}); allowed: {divisors}")
        if self.head_dim == 0:
            self._divisible("hidden_size", "num_heads")
            self.head_dim = self.hidden_size // self.num_heads
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        self._positive_float("rms_norm_eps", "rope_theta")
        self._positive_float("initializer_range", allow_zero=True)
        self._probability("attention_dropout")
        check_activation(self.activation)
        for name in ("qkv_bias", "out_bias", "mlp_bias", "qk_norm", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"LlamaConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"LlamaConfig.variant must be one of {list(VARIANTS)}, got {self.variant!r}")
        self._check_rope_scaling()
        self._token_id("bos_token_id", "pad_token_id")
        eos = self.eos_token_id
        if isinstance(eos, (list, tuple)):
            if not eos:
                raise ValueError("LlamaConfig.eos_token_id must be an id, a non-empty list of ids, or None")
            self.eos_token_id = list(eos)
            for i, value in enumerate(self.eos_token_id):
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < self.vocab_size:
                    raise ValueError(f"LlamaConfig.eos_token_id[{i}] must be an integer in [0, vocab_size="
                                     f"{self.vocab_size}), got {value!r}")
        else:
            self._token_id("eos_token_id")

    def _check_rope_scaling(self) -> None:
        scaling = self.rope_scaling
        if scaling is None:
            return
        if not isinstance(scaling, dict):
            raise ValueError(f"LlamaConfig.rope_scaling must be a dict or None, got {scaling!r}")
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"LlamaConfig.rope_scaling rope_type {rope_type!r} is not supported; supported: "
                             f"{sorted(ROPE_TYPES)} (yarn, dynamic and longrope scaling are not implemented)")
        missing = [k for k in ROPE_TYPES[rope_type] if not isinstance(scaling.get(k), (int, float))
                   or isinstance(scaling.get(k), bool)]
        if missing:
            raise ValueError(f"LlamaConfig.rope_scaling of rope_type {rope_type!r} needs number(s) {missing}")
        self.rope_scaling = {"rope_type": rope_type, **{k: scaling[k] for k in ROPE_TYPES[rope_type]}}
        if rope_type == "default":
            self.rope_scaling = None

    @property
    def eos_token_ids(self) -> list[int]:
        """``eos_token_id`` as a list (empty when there is none)."""
        eos = self.eos_token_id
        return [] if eos is None else list(eos) if isinstance(eos, list) else [eos]

    def _layer_parameters(self) -> int:
        h, d, f = self.hidden_size, self.head_dim, self.intermediate_size
        q, kv = self.num_heads * d, self.num_kv_heads * d
        attention = h * q + 2 * h * kv + q * h
        attention += (q + 2 * kv) * self.qkv_bias + h * self.out_bias + 2 * d * self.qk_norm
        mlp = 3 * h * f + (2 * f + h) * self.mlp_bias
        return attention + mlp + 2 * h

    def num_parameters(self, head: str | None = None) -> int:
        """Exact parameter count of the model ``create`` builds for ``head`` (default "causal_lm"),
        equal to what ``transformers`` counts for the same config."""
        head = self._check_head(head)
        h, V = self.hidden_size, self.vocab_size
        total = V * h + self.num_layers * self._layer_parameters() + h
        if head == "causal_lm" and not self.tie_word_embeddings:
            total += V * h
        return total

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward) at ``seq_len``: ``6 N + 12 L H d s``.

        ``N`` is every parameter that multiplies on every token: all but the embedding table,
        plus the LM head's ``V h`` (tied or not). The attention term counts ``QK^T`` and ``AV``
        over the full ``s x s`` square with the query heads' width ``H d`` (grouped-query
        attention shares keys and values between heads, it does not shrink this work), as
        PaLM, Megatron and torchtitan count MFU.
        """
        if seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len}")
        n = self.num_layers * self._layer_parameters() + self.hidden_size + self.vocab_size * self.hidden_size
        return 6 * n + 12 * self.num_layers * self.num_heads * self.head_dim * seq_len

    def _follow_defaults(self, changes: dict[str, Any]) -> dict[str, Any]:
        # A head width / KV-head count that was derived follows a new width or head count,
        # unless it is changed too (as intermediate_size does for GPT / ERNIE).
        if ({"hidden_size", "num_heads"} & set(changes) and "head_dim" not in changes
                and self.head_dim * self.num_heads == self.hidden_size):
            changes["head_dim"] = 0
        if "num_heads" in changes and "num_kv_heads" not in changes and self.num_kv_heads == self.num_heads:
            changes["num_kv_heads"] = 0
        return changes


def _llama3_rope(original_max: int = 8192, factor: float = 8.0) -> dict[str, Any]:
    # Llama 3.1's long-context RoPE (Meta's published settings for every 3.1 size; 3.2 uses factor 32).
    return {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": original_max}


_LLAMA3 = {"vocab_size": 128256, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "bos_token_id": 128000}
_LLAMA31 = {**_LLAMA3, "max_position_embeddings": 131072, "rope_scaling": _llama3_rope(),
            "eos_token_id": [128001, 128008, 128009]}
_QWEN2 = {"vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "qkv_bias": True, "variant": "qwen2",
          "max_position_embeddings": 32768, "bos_token_id": 151643, "eos_token_id": 151643}
_QWEN3 = {"vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "qk_norm": True, "variant": "qwen3",
          "max_position_embeddings": 40960, "head_dim": 128, "bos_token_id": 151643, "eos_token_id": 151645}

# Shapes as the models' published config.json files give them (Meta's Llama 2 / 3 / 3.1, Qwen's
# Qwen2.5 and Qwen3 releases); the tiny ones keep each architecture's features at test size.
CONFIGS = {
    "llama-tiny": LlamaConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                              intermediate_size=176, max_position_embeddings=256, rope_theta=500000.0,
                              rope_scaling=_llama3_rope(64)),
    "qwen2-tiny": LlamaConfig(**{**_QWEN2, "vocab_size": 512, "bos_token_id": None, "eos_token_id": 1,
                                 "max_position_embeddings": 256},
                              hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=176,
                              tie_word_embeddings=True),
    "qwen3-tiny": LlamaConfig(**{**_QWEN3, "vocab_size": 512, "bos_token_id": None, "eos_token_id": 1,
                                 "max_position_embeddings": 256, "head_dim": 32},
                              hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                              intermediate_size=176, tie_word_embeddings=True),
    "llama2-7b": LlamaConfig(rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2),
    "llama3-8b": LlamaConfig(**_LLAMA3, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                             intermediate_size=14336, max_position_embeddings=8192, eos_token_id=128001),
    "llama3.1-8b": LlamaConfig(**_LLAMA31, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
                               intermediate_size=14336),
    "llama3-70b": LlamaConfig(**_LLAMA3, hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8,
                              intermediate_size=28672, max_position_embeddings=8192, eos_token_id=128001),
    "llama3.2-1b": LlamaConfig(**{**_LLAMA31, "rope_scaling": _llama3_rope(factor=32.0)}, hidden_size=2048,
                               num_layers=16, num_heads=32, num_kv_heads=8, intermediate_size=8192,
                               tie_word_embeddings=True),
    "llama3-405b": LlamaConfig(**_LLAMA31, hidden_size=16384, num_layers=126, num_heads=128, num_kv_heads=8,
                               intermediate_size=53248),
    "qwen2.5-0.5b": LlamaConfig(**_QWEN2, hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2,
                                intermediate_size=4864, tie_word_embeddings=True),
    "qwen2.5-1.5b": LlamaConfig(**_QWEN2, hidden_size=1536, num_layers=28, num_heads=12, num_kv_heads=2,
                                intermediate_size=8960, tie_word_embeddings=True),
    "qwen2.5-7b": LlamaConfig(**{**_QWEN2, "vocab_size": 152064}, hidden_size=3584, num_layers=28, num_heads=28,
                              num_kv_heads=4, intermediate_size=18944),
    "qwen2.5-72b": LlamaConfig(**{**_QWEN2, "vocab_size": 152064}, hidden_size=8192, num_layers=80, num_heads=64,
                               num_kv_heads=8, intermediate_size=29568),
    "qwen3-0.6b": LlamaConfig(**_QWEN3, hidden_size=1024, num_layers=28, num_heads=16, num_kv_heads=8,
                              intermediate_size=3072, tie_word_embeddings=True),
    "qwen3-8b": LlamaConfig(**_QWEN3, hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                            intermediate_size=12288),
}

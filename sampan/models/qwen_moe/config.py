"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B) and Qwen3-MoE decoder configuration, torch-free.

Attention is the Llama family's (grouped-query, RoPE, Qwen2's q / k / v bias or Qwen3's per-head
q / k RMSNorm): :meth:`QwenMoeConfig.as_llama` gives the ``LlamaConfig`` those layers are built
from, and validating it checks the attention settings here too, so the two families cannot drift.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sampan.models.config_base import ModelConfig, MoEShape
from sampan.models.llama.config import LlamaConfig

VARIANTS = ("qwen2_moe", "qwen3_moe")
# variant -> the Llama-family variant whose attention it has.
LLAMA_VARIANT = {"qwen2_moe": "qwen2", "qwen3_moe": "qwen3"}
# variant -> how the router's load-balancing loss is summed (sampan.nn.MoEConfig.aux_loss).
# Qwen3 balances over the global batch (the Qwen3 report; transformers computes a per-batch
# Switch loss and only when output_router_logits is set); Qwen2-MoE per micro-batch.
AUX_LOSS = {"qwen2_moe": "micro_batch", "qwen3_moe": "global_batch"}


@dataclasses.dataclass
class QwenMoeConfig(ModelConfig):
    """A pre-norm decoder whose MLPs are Mixture-of-Experts blocks (softmax top-k routing).

    Fields:
        vocab_size: number of token ids.
        hidden_size: model width ``h``.
        num_layers: number of decoder layers ``L``.
        num_heads: query heads ``H``.
        num_kv_heads: key / value heads (grouped-query attention); must divide ``num_heads``; 0
            means ``num_heads``.
        head_dim: width of one head; 0 means ``hidden_size // num_heads`` (Qwen3-MoE sets 128).
        intermediate_size: SwiGLU width of the dense layers' MLP (the layers in
            ``mlp_only_layers`` or skipped by ``decoder_sparse_step``; unused when every layer
            is MoE, but kept because the checkpoint's config names it).
        moe_intermediate_size: SwiGLU width of one routed expert.
        shared_expert_intermediate_size: SwiGLU width of the shared expert every token also
            runs (Qwen2-MoE; its output is scaled by ``sigmoid(shared_expert_gate(x))``); 0 for
            none (Qwen3-MoE).
        num_experts: routed experts per MoE layer ``E``.
        num_experts_per_tok: experts each token is sent to (top-k).
        norm_topk_prob: renormalise the k chosen softmax weights to sum to 1 (Qwen3-MoE true,
            Qwen2-MoE false).
        decoder_sparse_step: layer ``i`` is an MoE layer when ``(i + 1) % decoder_sparse_step
            == 0`` (and it is not in ``mlp_only_layers``); 1 makes every layer MoE.
        mlp_only_layers: indices of layers kept dense whatever ``decoder_sparse_step`` says.
        router_aux_loss_coef: weight of the load-balancing loss while training (0 turns it
            off); Qwen3-MoE sums it over the global batch, Qwen2-MoE per micro-batch.
        max_position_embeddings: longest sequence the positions were trained for.
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base.
        rope_scaling: None, or a Llama-family ``rope_scaling`` dict ("linear" or "llama3").
        qkv_bias: bias on the q / k / v projections (Qwen2-MoE).
        out_bias: bias on the attention output projection (Qwen3-MoE's ``attention_bias``
            covers q / k / v and o together).
        qk_norm: RMSNorm over each head of q and k before RoPE (Qwen3-MoE).
        tie_word_embeddings: share the LM head with the input embedding.
        attention_dropout: dropout on attention probabilities (0 in every published model).
        activation: the SwiGLU gate's activation ("silu" in every published model).
        initializer_range: std of the normal init of linear, embedding and expert weights.
        bos_token_id / pad_token_id: special ids (None when absent).
        eos_token_id: the id (or ids) that end generation.
        variant: "qwen2_moe" or "qwen3_moe", the Hugging Face ``model_type`` written on export
            (which checks that the bias / qk-norm / shared-expert fields match it) and the
            balancing loss's scope.
    """

    vocab_size: int = 151936
    hidden_size: int = 2048
    num_layers: int = 48
    num_heads: int = 32
    num_kv_heads: int = 4
    head_dim: int = 128
    intermediate_size: int = 6144
    moe_intermediate_size: int = 768
    shared_expert_intermediate_size: int = 0
    num_experts: int = 128
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] = dataclasses.field(default_factory=list)
    router_aux_loss_coef: float = 0.001
    max_position_embeddings: int = 40960
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1000000.0
    rope_scaling: dict[str, Any] | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: bool = True
    tie_word_embeddings: bool = False
    attention_dropout: float = 0.0
    activation: str = "silu"
    initializer_range: float = 0.02
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None
    variant: str = "qwen3_moe"

    model_type: ClassVar[str] = "qwen_moe"
    HEADS: ClassVar[tuple[str, ...]] = ("causal_lm", "none")
    gated_mlp = True
    norm_kind = "rmsnorm"
    mlp_bias = False

    @property
    def position_table_rows(self) -> int:
        """Rotary positions: no table."""
        return 0

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"QwenMoeConfig.variant must be one of {list(VARIANTS)}, got {self.variant!r}")
        # Attention, dense-MLP and token-id settings are the Llama family's: its validation
        # (and its derived num_kv_heads / head_dim) applies, under this class's name.
        try:
            llama = self.as_llama()
        except ValueError as err:
            raise ValueError(str(err).replace("LlamaConfig.", "QwenMoeConfig.")) from None
        self.num_kv_heads, self.head_dim = llama.num_kv_heads, llama.head_dim
        self.rope_scaling, self.eos_token_id = llama.rope_scaling, llama.eos_token_id
        self._positive("moe_intermediate_size", "num_experts", "num_experts_per_tok", "decoder_sparse_step")
        self._non_negative("shared_expert_intermediate_size")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"QwenMoeConfig.num_experts_per_tok ({self.num_experts_per_tok}) must be at most "
                             f"num_experts ({self.num_experts})")
        if not isinstance(self.norm_topk_prob, bool):
            raise ValueError(f"QwenMoeConfig.norm_topk_prob must be true or false, got {self.norm_topk_prob!r}")
        self._positive_float("router_aux_loss_coef", allow_zero=True)
        self._check_mlp_only_layers()
        if not self.moe_layers():
            raise ValueError(f"QwenMoeConfig has no MoE layer (decoder_sparse_step={self.decoder_sparse_step}, "
                             f"mlp_only_layers={self.mlp_only_layers}, num_layers={self.num_layers}); a dense "
                             "Qwen model is the llama family's (variant 'qwen2' / 'qwen3')")

    def _check_mlp_only_layers(self) -> None:
        layers = self.mlp_only_layers
        if not isinstance(layers, (list, tuple)):
            raise ValueError(f"QwenMoeConfig.mlp_only_layers must be a list of layer indices, got {layers!r}")
        bad = [i for i in layers if not isinstance(i, int) or isinstance(i, bool)
               or not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"QwenMoeConfig.mlp_only_layers holds {bad}, not layer indices in [0, num_layers="
                             f"{self.num_layers})")
        self.mlp_only_layers = sorted(set(layers))

    def as_llama(self) -> LlamaConfig:
        """The ``LlamaConfig`` of this model's attention and dense MLP (what ``LlamaAttention`` and
        ``LlamaMLP`` are built from); it validates those settings."""
        return LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, num_layers=self.num_layers,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            intermediate_size=self.intermediate_size, max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta, rope_scaling=self.rope_scaling,
            qkv_bias=self.qkv_bias, out_bias=self.out_bias, mlp_bias=False, qk_norm=self.qk_norm,
            tie_word_embeddings=self.tie_word_embeddings, attention_dropout=self.attention_dropout,
            activation=self.activation, initializer_range=self.initializer_range,
            bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id,
            variant=LLAMA_VARIANT[self.variant],
        )

    @property
    def eos_token_ids(self) -> list[int]:
        """``eos_token_id`` as a list (empty when there is none)."""
        eos = self.eos_token_id
        return [] if eos is None else list(eos) if isinstance(eos, list) else [eos]

    # -- MoE layout ------------------------------------------------------------------------------
    def is_moe_layer(self, index: int) -> bool:
        """Whether layer ``index``'s MLP is an MoE block (transformers' rule for both variants)."""
        return index not in self.mlp_only_layers and (index + 1) % self.decoder_sparse_step == 0

    def moe_layers(self) -> tuple[int, ...]:
        """Indices of the MoE layers."""
        return tuple(i for i in range(self.num_layers) if self.is_moe_layer(i))

    @property
    def aux_loss(self) -> str:
        """The balancing loss's scope for ``sampan.nn.MoEConfig.aux_loss`` ("none" when its
        coefficient is 0)."""
        return AUX_LOSS[self.variant] if self.router_aux_loss_coef > 0 else "none"

    def moe_config_fields(self) -> dict[str, Any]:
        """Keyword arguments of the ``sampan.nn.MoEConfig`` every MoE layer is built from."""
        shared = self.shared_expert_intermediate_size
        return {
            "hidden_size": self.hidden_size, "num_experts": self.num_experts, "top_k": self.num_experts_per_tok,
            "expert_intermediate_size": self.moe_intermediate_size, "activation": self.activation,
            "shared_intermediate_size": shared, "shared_expert_gate": shared > 0,
            "score_func": "softmax", "norm_topk_prob": self.norm_topk_prob,
            "aux_loss": self.aux_loss, "aux_loss_coef": float(self.router_aux_loss_coef),
        }

    def moe_shape(self) -> MoEShape:
        """Routed experts, top-k, widths and which layers are MoE (for the planner and the zoo)."""
        return MoEShape(num_experts=self.num_experts, top_k=self.num_experts_per_tok,
                        expert_intermediate_size=self.moe_intermediate_size,
                        shared_intermediate_size=self.shared_expert_intermediate_size,
                        moe_layers=self.moe_layers(), dense_intermediate_size=self.intermediate_size,
                        score_func="softmax", capacity_factor=None)

    # -- sizes -----------------------------------------------------------------------------------
    def _attention_and_norms(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        attention = h * q + 2 * h * kv + q * h
        attention += (q + 2 * kv) * self.qkv_bias + h * self.out_bias + 2 * d * self.qk_norm
        return attention + 2 * h

    def _moe_block(self, experts: int) -> int:
        """One MoE block's parameters with ``experts`` routed experts counted."""
        h, shared = self.hidden_size, self.shared_expert_intermediate_size
        block = self.num_experts * h + experts * 3 * h * self.moe_intermediate_size  # router + experts
        if shared:
            block += 3 * h * shared + h  # the shared expert and its sigmoid gate
        return block

    def _body(self, experts: int) -> int:
        """Decoder layers and final norm (no embedding, no head), ``experts`` per MoE layer."""
        moe = len(self.moe_layers())
        dense = self.num_layers - moe
        return (self.num_layers * self._attention_and_norms() + moe * self._moe_block(experts)
                + dense * 3 * self.hidden_size * self.intermediate_size + self.hidden_size)

    def _with_embeddings(self, body: int, head: str | None) -> int:
        head = self._check_head(head)
        total = body + self.vocab_size * self.hidden_size
        if head == "causal_lm" and not self.tie_word_embeddings:
            total += self.vocab_size * self.hidden_size
        return total

    def num_parameters(self, head: str | None = None) -> int:
        """Every parameter of the model ``create`` builds for ``head`` (default "causal_lm"), all
        experts counted; equal to what ``transformers`` counts for the same config."""
        return self._with_embeddings(self._body(self.num_experts), head)

    def num_active_parameters(self, head: str | None = None) -> int:
        """Parameters one token uses: ``num_experts_per_tok`` routed experts per MoE layer (plus
        the router, the shared expert and everything outside the MoE blocks)."""
        return self._with_embeddings(self._body(self.num_experts_per_tok), head)

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward) at ``seq_len``: ``6 N_active + 12 L H d s``.

        ``N_active`` is every parameter that multiplies on every token: the attention, the
        router's ``E x h`` matmul, the ``top_k`` experts a token runs, the shared expert and its
        gate, the dense layers' MLPs and the LM head's ``V h`` (tied or not), not the embedding
        table. The attention term is the Llama family's (``QK^T`` and ``AV`` over the full
        ``s x s`` square with the query heads' width).
        """
        if seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len}")
        n = self._body(self.num_experts_per_tok) + self.vocab_size * self.hidden_size
        return 6 * n + 12 * self.num_layers * self.num_heads * self.head_dim * seq_len

    def _follow_defaults(self, changes: dict[str, Any]) -> dict[str, Any]:
        # As the Llama family: a derived head width / KV-head count follows a new width or head
        # count unless it is changed too.
        if ({"hidden_size", "num_heads"} & set(changes) and "head_dim" not in changes
                and self.head_dim * self.num_heads == self.hidden_size):
            changes["head_dim"] = 0
        if "num_heads" in changes and "num_kv_heads" not in changes and self.num_kv_heads == self.num_heads:
            changes["num_kv_heads"] = 0
        return changes


_QWEN2_MOE = {"vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "qkv_bias": True,
              "qk_norm": False, "norm_topk_prob": False, "variant": "qwen2_moe", "bos_token_id": 151643,
              "eos_token_id": 151643, "head_dim": 0}
_QWEN3_MOE = {"vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "qk_norm": True,
              "norm_topk_prob": True, "variant": "qwen3_moe", "max_position_embeddings": 40960, "head_dim": 128,
              "bos_token_id": 151643, "eos_token_id": 151645}
_TINY = {"vocab_size": 512, "bos_token_id": None, "eos_token_id": 1, "max_position_embeddings": 256}

# Shapes as the published config.json files give them (Qwen's Qwen1.5-MoE-A2.7B, Qwen3-30B-A3B
# and Qwen3-235B-A22B); the tiny ones keep each architecture's features at test size: dense and
# MoE layers side by side, 8 experts with top-2 so routing matters.
CONFIGS = {
    "qwen2-moe-tiny": QwenMoeConfig(**{**_QWEN2_MOE, **_TINY}, hidden_size=64, num_layers=3, num_heads=4,
                                    num_kv_heads=2, intermediate_size=128, moe_intermediate_size=32,
                                    shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
                                    decoder_sparse_step=1, mlp_only_layers=[1], tie_word_embeddings=True),
    "qwen3-moe-tiny": QwenMoeConfig(**{**_QWEN3_MOE, **_TINY, "head_dim": 32}, hidden_size=64, num_layers=4,
                                    num_heads=4, num_kv_heads=2, intermediate_size=128, moe_intermediate_size=32,
                                    num_experts=8, num_experts_per_tok=2, decoder_sparse_step=2),
    "qwen1.5-moe-a2.7b": QwenMoeConfig(**_QWEN2_MOE, hidden_size=2048, num_layers=24, num_heads=16,
                                       num_kv_heads=16, intermediate_size=5632, moe_intermediate_size=1408,
                                       shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
                                       max_position_embeddings=8192),
    "qwen3-30b-a3b": QwenMoeConfig(**_QWEN3_MOE, hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4,
                                   intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                                   num_experts_per_tok=8),
    "qwen3-235b-a22b": QwenMoeConfig(**_QWEN3_MOE, hidden_size=4096, num_layers=94, num_heads=64, num_kv_heads=4,
                                     intermediate_size=12288, moe_intermediate_size=1536, num_experts=128,
                                     num_experts_per_tok=8),
}

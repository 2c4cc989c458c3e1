"""ERNIE 4.5 decoder configuration (Baidu's 2025 release: dense 0.3B, MoE 21B-A3B and 300B-A47B), torch-free.

Not to be confused with ``sampan.models.ernie`` (the BERT-style ERNIE 1.0 / 3.0 encoder): ERNIE 4.5
is a Llama-like decoder (RMSNorm, grouped-query attention, SwiGLU) whose RoPE rotates *interleaved*
pairs of a head's dimensions, and whose larger models replace the MLP of most layers with a
Mixture-of-Experts block (softmax router, top-k renormalised, shared experts, and a score-correction
bias used for choosing experts only).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sampan.models.config_base import ModelConfig, MoEShape
from sampan.utils.activations import check_activation

# sampan.nn.MoEConfig.aux_loss's choices (kept here so the config stays torch-free).
AUX_LOSSES = ("none", "micro_batch", "global_batch", "sequence")


@dataclasses.dataclass
class Ernie4_5Config(ModelConfig):
    """ERNIE 4.5: a pre-norm RMSNorm decoder, GQA with interleaved RoPE, SwiGLU or MoE MLPs.

    ``moe_num_experts == 0`` is the dense model (Hugging Face ``model_type`` "ernie4_5"), anything
    else the MoE one ("ernie4_5_moe"), whose layers ``i`` with ``(i + 1) % moe_layer_interval == 0``
    and ``moe_layer_start_index <= i <= moe_layer_end_index`` are MoE blocks and the rest dense.

    Fields:
        vocab_size: number of token ids.
        hidden_size: model width ``h``.
        num_layers: number of decoder layers ``L`` (HF ``num_hidden_layers``).
        num_heads: query heads ``H`` (HF ``num_attention_heads``).
        num_kv_heads: key / value heads (grouped-query attention); must divide ``num_heads``; 0
            means ``num_heads``.
        head_dim: width of one head; 0 means ``hidden_size // num_heads``. ERNIE 4.5 0.3B sets
            128 with ``hidden_size / num_heads = 64``.
        intermediate_size: SwiGLU width of the dense layers' MLP.
        max_position_embeddings: longest sequence the positions were trained for.
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base (500000 in every published ERNIE 4.5).
        use_bias: bias on every attention and MLP projection (false in every published model;
            not supported with MoE layers, whose experts have none).
        tie_word_embeddings: share the LM head with the input embedding.
        activation: the SwiGLU gate's activation ("silu").
        initializer_range: std of the normal init of linear, embedding and expert weights.
        bos_token_id / pad_token_id: special ids (None when absent).
        eos_token_id: the id (or ids) that end generation.
        moe_num_experts: routed experts per MoE layer ``E``; 0 makes the model dense.
        moe_k: experts each token is routed to (top-k).
        moe_intermediate_size: SwiGLU width of one routed expert.
        moe_num_shared_experts: shared experts every token also runs; they form one SwiGLU of
            width ``moe_intermediate_size * moe_num_shared_experts``.
        moe_layer_start_index: first layer that may be an MoE layer.
        moe_layer_end_index: last layer that may be an MoE layer; -1 means the last layer.
        moe_layer_interval: layer ``i`` is an MoE layer only when ``(i + 1) % interval == 0``.
        moe_norm_min: floor of the denominator when the top-k router weights are renormalised
            to sum to one.
        moe_aux_loss: sampan's load-balancing loss ("none", "micro_batch", "global_batch" or
            "sequence"; see ``sampan.nn.MoEConfig.aux_loss``); it only changes gradients.
        router_aux_loss_coef: weight of that loss (HF's name).
        moe_bias_update_rate: step of the aux-loss-free update of the score-correction bias
            (``update_expert_bias``, once per optimizer step); 0 keeps the bias as loaded.
        moe_capacity_factor: None for dropless routing (what transformers computes), else the
            expert capacity factor (tokens over capacity are dropped).
    """

    vocab_size: int = 103424
    hidden_size: int = 1024
    num_layers: int = 18
    num_heads: int = 16
    num_kv_heads: int = 2
    head_dim: int = 128
    intermediate_size: int = 3072
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    use_bias: bool = False
    tie_word_embeddings: bool = True
    activation: str = "silu"
    initializer_range: float = 0.02
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = 0
    moe_num_experts: int = 0
    moe_k: int = 0
    moe_intermediate_size: int = 0
    moe_num_shared_experts: int = 0
    moe_layer_start_index: int = 0
    moe_layer_end_index: int = -1
    moe_layer_interval: int = 1
    moe_norm_min: float = 1e-12
    moe_aux_loss: str = "none"
    router_aux_loss_coef: float = 0.0
    moe_bias_update_rate: float = 1e-3
    moe_capacity_factor: float | None = None

    model_type: ClassVar[str] = "ernie4_5"
    HEADS: ClassVar[tuple[str, ...]] = ("causal_lm", "none")
    gated_mlp = True
    norm_kind = "rmsnorm"

    # The planner's block description: one ``use_bias`` covers every projection.
    @property
    def qkv_bias(self) -> bool:  # type: ignore[override]
        return self.use_bias

    @property
    def out_bias(self) -> bool:  # type: ignore[override]
        return self.use_bias

    @property
    def mlp_bias(self) -> bool:  # type: ignore[override]
        return self.use_bias

    @property
    def position_table_rows(self) -> int:
        """Rotary positions: no table."""
        return 0

    def __post_init__(self) -> None:
        name = type(self).__name__
        self._positive("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                       "max_position_embeddings")
        self._non_negative("num_kv_heads", "head_dim")
        if self.num_kv_heads == 0:
            self.num_kv_heads = self.num_heads
        if self.num_heads % self.num_kv_heads:
            divisors = [d for d in range(1, self.num_heads + 1) if self.num_heads % d == 0]
            raise ValueError(f"{name}.num_kv_heads ({self.num_kv_heads}) must divide num_heads "
                             f"({self.num_heads}); allowed: {divisors}")
        if self.head_dim == 0:
            self._divisible("hidden_size", "num_heads")
            self.head_dim = self.hidden_size // self.num_heads
        if self.head_dim % 2:
            raise ValueError(f"{name}.head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        self._positive_float("rms_norm_eps", "rope_theta")
        self._positive_float("initializer_range", allow_zero=True)
        check_activation(self.activation)
        for flag in ("use_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{name}.{flag} must be true or false, got {getattr(self, flag)!r}")
        self._token_id("bos_token_id", "pad_token_id")
        eos = self.eos_token_id
        if isinstance(eos, (list, tuple)):
            if not eos:
                raise ValueError(f"{name}.eos_token_id must be an id, a non-empty list of ids, or None")
            self.eos_token_id = list(eos)
            for i, value in enumerate(self.eos_token_id):
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < self.vocab_size:
                    raise ValueError(f"{name}.eos_token_id[{i}] must be an integer in [0, vocab_size="
                                     f"{self.vocab_size}), got {value!r}")
        else:
            self._token_id("eos_token_id")
        self._check_moe()

    def _check_moe(self) -> None:
        name = type(self).__name__
        self._non_negative("moe_num_experts", "moe_k", "moe_intermediate_size", "moe_num_shared_experts",
                           "moe_layer_start_index")
        self._positive("moe_layer_interval")
        self._positive_float("moe_norm_min", "moe_bias_update_rate", "router_aux_loss_coef", allow_zero=True)
        self._positive_float("moe_norm_min")
        if self.moe_aux_loss not in AUX_LOSSES:
            raise ValueError(f"{name}.moe_aux_loss must be one of {list(AUX_LOSSES)}, got {self.moe_aux_loss!r}")
        end = self.moe_layer_end_index
        if not isinstance(end, int) or isinstance(end, bool) or not -1 <= end < self.num_layers:
            raise ValueError(f"{name}.moe_layer_end_index must be -1 (the last layer) or a layer index in "
                             f"[0, num_layers={self.num_layers}), got {end!r}")
        if self.moe_capacity_factor is not None:
            self._positive_float("moe_capacity_factor")
        if self.moe_num_experts == 0:
            return
        if not 1 <= self.moe_k <= self.moe_num_experts:
            raise ValueError(f"{name}.moe_k must be in [1, moe_num_experts={self.moe_num_experts}], got {self.moe_k}")
        self._positive("moe_intermediate_size")
        if not self.moe_layers:
            raise ValueError(f"{name}: moe_num_experts={self.moe_num_experts} but no layer is an MoE layer "
                             f"(moe_layer_start_index={self.moe_layer_start_index}, moe_layer_end_index={end}, "
                             f"moe_layer_interval={self.moe_layer_interval}, num_layers={self.num_layers}); "
                             "set moe_num_experts=0 for a dense model")
        if self.use_bias:
            raise ValueError(f"{name}.use_bias=True is not supported with MoE layers: sampan's MoE block has no "
                             "biases on its experts (no published ERNIE 4.5 model uses them); set use_bias=False")

    # -- the MoE layout -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        """Whether any layer is an MoE block (the HF ``ernie4_5_moe`` architecture)."""
        return self.moe_num_experts > 0

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Indices of the MoE layers (empty for a dense model), as transformers decides them."""
        if self.moe_num_experts == 0:
            return ()
        end = self.num_layers - 1 if self.moe_layer_end_index == -1 else self.moe_layer_end_index
        return tuple(i for i in range(self.num_layers) if (i + 1) % self.moe_layer_interval == 0
                     and self.moe_layer_start_index <= i <= end)

    @property
    def shared_intermediate_size(self) -> int:
        """Width of the shared-expert SwiGLU (all shared experts together)."""
        return self.moe_intermediate_size * self.moe_num_shared_experts

    def moe_shape(self) -> MoEShape | None:
        """The MoE layout the planner and the zoo read (None for the dense model)."""
        if not self.is_moe:
            return None
        return MoEShape(num_experts=self.moe_num_experts, top_k=self.moe_k,
                        expert_intermediate_size=self.moe_intermediate_size,
                        shared_intermediate_size=self.shared_intermediate_size, moe_layers=self.moe_layers,
                        dense_intermediate_size=self.intermediate_size, score_func="softmax",
                        capacity_factor=self.moe_capacity_factor)

    @property
    def eos_token_ids(self) -> list[int]:
        """``eos_token_id`` as a list (empty when there is none)."""
        eos = self.eos_token_id
        return [] if eos is None else list(eos) if isinstance(eos, list) else [eos]

    # -- counts ---------------------------------------------------------------------------------
    def _attention_parameters(self) -> int:
        h, d = self.hidden_size, self.head_dim
        q, kv = self.num_heads * d, self.num_kv_heads * d
        return 2 * h * q + 2 * h * kv + (q + 2 * kv + h) * self.use_bias + 2 * h  # + the two norms

    def _expert_parameters(self) -> int:
        """One routed expert's SwiGLU."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def _mlp_parameters(self, layer: int, experts: int) -> int:
        """Layer ``layer``'s MLP, counting ``experts`` routed experts if it is an MoE layer."""
        h = self.hidden_size
        if layer in set(self.moe_layers):
            return self.moe_num_experts * h + experts * self._expert_parameters() + 3 * h * self.shared_intermediate_size
        f = self.intermediate_size
        return 3 * h * f + (2 * f + h) * self.use_bias

    def _body_parameters(self, experts: int | None) -> int:
        """Every layer plus the final norm (no embedding); ``experts`` routed experts per MoE layer
        (None: all of them)."""
        n_experts = self.moe_num_experts if experts is None else experts
        return (self.num_layers * self._attention_parameters() + self.hidden_size
                + sum(self._mlp_parameters(i, n_experts) for i in range(self.num_layers)))

    def num_parameters(self, head: str | None = None) -> int:
        """Exact parameter count of the model ``create`` builds for ``head`` (default "causal_lm").

        Equal to transformers' count of the same config, except that transformers also counts the
        MoE score-correction bias (``moe_statics.e_score_correction_bias``, ``E`` numbers per MoE
        layer) among its parameters (``requires_grad=False``); sampan keeps it as a buffer, since no
        optimizer ever steps it.
        """
        head = self._check_head(head)
        h, V = self.hidden_size, self.vocab_size
        total = V * h + self._body_parameters(None)
        if head == "causal_lm" and not self.tie_word_embeddings:
            total += V * h
        return total

    def num_active_parameters(self, head: str | None = None) -> int:
        """Parameters one token uses: ``moe_k`` routed experts per MoE layer (plus the router and
        shared experts), everything else as ``num_parameters``."""
        head = self._check_head(head)
        idle = (self.moe_num_experts - self.moe_k) * self._expert_parameters() * len(self.moe_layers)
        return self.num_parameters(head) - idle

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward) at ``seq_len``: ``6 N_active + 12 L H d s``.

        ``N_active`` is every parameter one token multiplies with: the layers with ``moe_k`` routed
        experts per MoE layer (and the router's ``E x h``), the final norm and the LM head's ``V h``
        (tied or not), as the Llama family counts; the attention term counts ``QK^T`` and ``AV``
        over the full ``s x s`` square.
        """
        if seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len}")
        n = self._body_parameters(self.moe_k) + self.vocab_size * self.hidden_size
        return 6 * n + 12 * self.num_layers * self.num_heads * self.head_dim * seq_len

    def _follow_defaults(self, changes: dict[str, Any]) -> dict[str, Any]:
        # A head width / KV-head count that was derived follows a new width or head count unless
        # it is changed too (as in LlamaConfig).
        if ({"hidden_size", "num_heads"} & set(changes) and "head_dim" not in changes
                and self.head_dim * self.num_heads == self.hidden_size):
            changes["head_dim"] = 0
        if "num_heads" in changes and "num_kv_heads" not in changes and self.num_kv_heads == self.num_heads:
            changes["num_kv_heads"] = 0
        return changes


# Published config.json shapes (baidu/ERNIE-4.5-*-PT on the Hugging Face Hub); the tiny ones keep
# each architecture's features (GQA, head_dim != h / H, tied head, dense + MoE layers, shared
# experts) at test size.
_ERNIE45 = {"vocab_size": 103424, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
_TINY = {"vocab_size": 512, "max_position_embeddings": 256, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}

CONFIGS = {
    "ernie4.5-tiny": Ernie4_5Config(**_TINY, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,
                                    intermediate_size=176, tie_word_embeddings=True),
    "ernie4.5-moe-tiny": Ernie4_5Config(**_TINY, hidden_size=64, num_layers=3, num_heads=4, num_kv_heads=2,
                                        head_dim=16, intermediate_size=176, tie_word_embeddings=True,
                                        moe_num_experts=8, moe_k=2, moe_intermediate_size=32,
                                        moe_num_shared_experts=1, moe_layer_start_index=1),
    "ernie4.5-0.3b": Ernie4_5Config(**_ERNIE45, hidden_size=1024, num_layers=18, num_heads=16, num_kv_heads=2,
                                    head_dim=128, intermediate_size=3072, tie_word_embeddings=True),
    "ernie4.5-21b-a3b": Ernie4_5Config(**_ERNIE45, hidden_size=2560, num_layers=28, num_heads=20, num_kv_heads=4,
                                       head_dim=128, intermediate_size=12288, tie_word_embeddings=True,
                                       moe_num_experts=64, moe_k=6, moe_intermediate_size=1536,
                                       moe_num_shared_experts=2, moe_layer_start_index=1),
    # Tied as the 21B: with an untied head it would hold 299.5B / 47.9B active, named "A48B".
    "ernie4.5-300b-a47b": Ernie4_5Config(**_ERNIE45, hidden_size=8192, num_layers=54, num_heads=64, num_kv_heads=8,
                                         head_dim=128, intermediate_size=28672, tie_word_embeddings=True,
                                         moe_num_experts=64, moe_k=8, moe_intermediate_size=3584,
                                         moe_num_shared_experts=0, moe_layer_start_index=3),
}

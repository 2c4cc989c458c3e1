"""DeepSeek-V3 configuration (multi-head latent attention, group-limited sigmoid MoE, MTP), torch-free."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sampan.models.config_base import ModelConfig, MoEShape
from sampan.utils.activations import check_activation

# rope_scaling["rope_type"] -> (keys it needs, keys it may have) besides rope_type.
ROPE_TYPES = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "yarn": (("factor", "original_max_position_embeddings"), ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")),
}
AUX_LOSSES = ("none", "micro_batch", "global_batch", "sequence")


@dataclasses.dataclass
class DeepseekV3Config(ModelConfig):
    """A pre-norm decoder with multi-head latent attention (MLA) and Mixture-of-Experts MLPs.

    Attention compresses keys and values into one ``kv_lora_rank`` latent per token plus one
    shared rotary key of ``qk_rope_head_dim`` (what the KV cache holds); queries go through a
    ``q_lora_rank`` bottleneck. The first ``first_k_dense_replace`` layers have a dense SwiGLU MLP,
    the rest an MoE block: sigmoid router scores, experts chosen within the best ``topk_group`` of
    ``n_group`` groups, a score-correction bias for aux-loss-free balancing, and shared experts.

    Fields:
        vocab_size: number of token ids.
        hidden_size: model width ``h``.
        num_layers: decoder layers ``L`` (HF ``num_hidden_layers``; the MTP modules are extra).
        num_heads: attention heads ``H``.
        intermediate_size: SwiGLU width of the dense layers' MLP.
        moe_intermediate_size: SwiGLU width of one routed (and one shared) expert.
        n_routed_experts: routed experts per MoE layer ``E``.
        n_shared_experts: shared experts per MoE layer (together one SwiGLU of
            ``n_shared_experts * moe_intermediate_size``); 0 for none.
        num_experts_per_tok: routed experts each token goes to (top-k).
        n_group: expert groups for group-limited routing (must divide ``n_routed_experts``).
        topk_group: groups a token may pick its experts from (the best by the sum of each group's
            top-2 scores).
        routed_scaling_factor: multiplies the routed experts' weights (after renormalisation).
        norm_topk_prob: renormalise the chosen experts' weights to sum to 1.
        first_k_dense_replace: how many first layers keep a dense MLP.
        q_lora_rank: width of the query bottleneck (q_a_proj -> RMSNorm -> q_b_proj); None for a
            plain q_proj (DeepSeek-V2-Lite style).
        kv_lora_rank: width of the compressed key/value latent (cached per token).
        qk_nope_head_dim: per-head query/key width without rotary positions.
        qk_rope_head_dim: per-head query/key width with rotary positions (the key part is shared by
            all heads and cached); must be even.
        v_head_dim: per-head value width.
        max_position_embeddings: longest sequence the model was built for.
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base.
        rope_scaling: None, ``{"rope_type": "linear", "factor"}`` or YaRN's ``{"rope_type": "yarn",
            "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
            "mscale_all_dim"}``; with YaRN and ``mscale_all_dim`` the softmax scale is multiplied by
            ``(0.1 * mscale_all_dim * ln(factor) + 1) ** 2``.
        rope_interleave: the rotary dimensions of q_b_proj / kv_a_proj_with_mqa are interleaved
            pairs (DeepSeek's checkpoints); False for the half-split layout.
        attention_bias: bias on q_a_proj, kv_a_proj_with_mqa and o_proj (HF ``attention_bias``).
        attention_dropout: dropout on attention probabilities (0 in the published model).
        tie_word_embeddings: share the LM head with the input embedding.
        activation: the SwiGLU gate's activation.
        initializer_range: std of the normal init of linear, embedding and expert weights.
        bos_token_id / pad_token_id: special ids (None when absent).
        eos_token_id: the id (or ids) that end generation.
        num_nextn_predict_layers: multi-token-prediction modules (DeepSeek-V3 section 2.2; HF key
            of the same name, 1 in the published config). Module ``k`` predicts token ``t + k + 1``;
            0 (the default) builds none, so logits equal transformers'.
        mtp_loss_weight: the MTP loss's weight ``lambda`` added to the main loss when labels are
            given (averaged over the MTP modules; 0.3 early in DeepSeek-V3's training, then 0.1).
        aux_loss: the MoE balance loss, "none", "micro_batch", "global_batch" or "sequence"
            (DeepSeek-V3's complementary sequence-wise loss).
        aux_loss_coef: its weight (DeepSeek-V3: 1e-4; the HF key ``aux_loss_alpha``).
        bias_update_rate: step of the aux-loss-free score-correction bias update (``gamma``).
    """

    vocab_size: int = 129280
    hidden_size: int = 7168
    num_layers: int = 61
    num_heads: int = 128
    intermediate_size: int = 18432
    moe_intermediate_size: int = 2048
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 8
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    first_k_dense_replace: int = 3
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    max_position_embeddings: int = 163840
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rope_interleave: bool = True
    attention_bias: bool = False
    attention_dropout: float = 0.0
    tie_word_embeddings: bool = False
    activation: str = "silu"
    initializer_range: float = 0.02
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 1
    pad_token_id: int | None = None
    num_nextn_predict_layers: int = 0
    mtp_loss_weight: float = 0.3
    aux_loss: str = "sequence"
    aux_loss_coef: float = 1e-4
    bias_update_rate: float = 1e-3

    model_type: ClassVar[str] = "deepseek_v3"
    HEADS: ClassVar[tuple[str, ...]] = ("causal_lm", "none")
    gated_mlp = True
    norm_kind = "rmsnorm"
    qkv_bias = False
    out_bias = False
    mlp_bias = False

    def __post_init__(self) -> None:
        self._positive("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                       "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok", "n_group", "topk_group",
                       "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "max_position_embeddings")
        self._non_negative("n_shared_experts", "first_k_dense_replace", "qk_nope_head_dim", "num_nextn_predict_layers")
        if self.q_lora_rank is not None:
            self._positive("q_lora_rank")
        name = type(self).__name__
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"{name}.qk_rope_head_dim must be even (RoPE rotates pairs), got {self.qk_rope_head_dim}")
        self._divisible("n_routed_experts", "n_group")
        per_group = self.n_routed_experts // self.n_group
        if per_group < 2:
            raise ValueError(f"{name}: each of the n_group={self.n_group} groups needs >= 2 experts (a group's score "
                             f"is its top-2 sum), got {per_group}; use n_group <= {self.n_routed_experts // 2}")
        if self.topk_group > self.n_group:
            raise ValueError(f"{name}.topk_group ({self.topk_group}) cannot exceed n_group ({self.n_group})")
        if self.num_experts_per_tok > self.topk_group * per_group:
            raise ValueError(f"{name}.num_experts_per_tok ({self.num_experts_per_tok}) exceeds the "
                             f"{self.topk_group * per_group} experts of the topk_group={self.topk_group} groups a "
                             "token may choose from; raise topk_group or lower num_experts_per_tok")
        if self.first_k_dense_replace > self.num_layers:
            raise ValueError(f"{name}.first_k_dense_replace ({self.first_k_dense_replace}) cannot exceed num_layers "
                             f"({self.num_layers})")
        self._positive_float("rms_norm_eps", "rope_theta", "routed_scaling_factor")
        self._positive_float("initializer_range", "mtp_loss_weight", "aux_loss_coef", "bias_update_rate",
                             allow_zero=True)
        self._probability("attention_dropout")
        check_activation(self.activation)
        for flag in ("norm_topk_prob", "rope_interleave", "attention_bias", "tie_word_embeddings"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{name}.{flag} must be true or false, got {getattr(self, flag)!r}")
        if self.aux_loss not in AUX_LOSSES:
            raise ValueError(f"{name}.aux_loss must be one of {list(AUX_LOSSES)}, got {self.aux_loss!r}")
        self._check_rope_scaling()
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

    def _check_rope_scaling(self) -> None:
        scaling, name = self.rope_scaling, type(self).__name__
        if scaling is None:
            return
        if not isinstance(scaling, dict):
            raise ValueError(f"{name}.rope_scaling must be a dict or None, got {scaling!r}")
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"{name}.rope_scaling rope_type {rope_type!r} is not supported; supported: "
                             f"{sorted(ROPE_TYPES)}")
        required, optional = ROPE_TYPES[rope_type]
        unknown = sorted(set(scaling) - {"rope_type", "type", "rope_theta", *required, *optional})
        if unknown:
            raise ValueError(f"{name}.rope_scaling of rope_type {rope_type!r} has unsupported key(s) {unknown}; "
                             f"allowed: {sorted({*required, *optional})}")
        numbers = [k for k in (*required, *optional) if k in scaling and scaling[k] is not None]
        bad = [k for k in required if k not in numbers]
        bad += [k for k in numbers if not isinstance(scaling[k], (int, float)) or isinstance(scaling[k], bool)]
        if bad:
            raise ValueError(f"{name}.rope_scaling of rope_type {rope_type!r} needs number(s) {sorted(set(bad))}")
        if rope_type != "default" and scaling["factor"] < 1:
            raise ValueError(f"{name}.rope_scaling factor must be >= 1, got {scaling['factor']}")
        self.rope_scaling = None if rope_type == "default" else {"rope_type": rope_type,
                                                                 **{k: scaling[k] for k in numbers}}

    # -- derived shapes -----------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width, ``qk_nope_head_dim + qk_rope_head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def head_dim(self) -> int:
        """The query/key head width (what a Llama-style reader of ``head_dim`` expects)."""
        return self.qk_head_dim

    @property
    def num_kv_heads(self) -> int:
        """MLA expands its latent into keys and values for every head: as many as ``num_heads``."""
        return self.num_heads

    @property
    def position_table_rows(self) -> int:
        """Rotary positions: no table."""
        return 0

    @property
    def eos_token_ids(self) -> list[int]:
        """``eos_token_id`` as a list (empty when there is none)."""
        eos = self.eos_token_id
        return [] if eos is None else list(eos) if isinstance(eos, list) else [eos]

    @property
    def moe_layer_indices(self) -> tuple[int, ...]:
        """Indices of the decoder layers whose MLP is an MoE block."""
        return tuple(range(self.first_k_dense_replace, self.num_layers))

    def moe_shape(self) -> MoEShape:
        """The MoE layout the planner and the zoo read."""
        return MoEShape(num_experts=self.n_routed_experts, top_k=self.num_experts_per_tok,
                        expert_intermediate_size=self.moe_intermediate_size,
                        shared_intermediate_size=self.n_shared_experts * self.moe_intermediate_size,
                        moe_layers=self.moe_layer_indices, dense_intermediate_size=self.intermediate_size,
                        score_func="sigmoid")

    # -- parameter and FLOP counts ------------------------------------------------------------------
    def _attention_parameters(self) -> int:
        h, H, bias = self.hidden_size, self.num_heads, int(self.attention_bias)
        if self.q_lora_rank is None:
            q = h * H * self.qk_head_dim
        else:
            r = self.q_lora_rank
            q = h * r + r * bias + r + r * H * self.qk_head_dim
        kv_a = self.kv_lora_rank + self.qk_rope_head_dim
        kv = h * kv_a + kv_a * bias + self.kv_lora_rank + self.kv_lora_rank * H * (self.qk_nope_head_dim
                                                                                     + self.v_head_dim)
        return q + kv + H * self.v_head_dim * h + h * bias

    def _expert_parameters(self) -> int:
        return 3 * self.hidden_size * self.moe_intermediate_size

    def _layer_parameters(self, moe: bool, routed: int | None = None) -> int:
        """One decoder layer; ``routed`` routed experts counted (default: all of them)."""
        h = self.hidden_size
        if moe:
            routed = self.n_routed_experts if routed is None else routed
            mlp = (self.n_routed_experts * h  # the router (its correction bias is a buffer)
                   + (routed + self.n_shared_experts) * self._expert_parameters())
        else:
            mlp = 3 * h * self.intermediate_size
        return self._attention_parameters() + mlp + 2 * h

    def _mtp_parameters(self, routed: int | None = None) -> int:
        """The MTP modules: enorm, hnorm, eh_proj, one MoE decoder layer and the head's norm each
        (the embedding and the head are the main model's)."""
        h = self.hidden_size
        return self.num_nextn_predict_layers * (3 * h + 2 * h * h + self._layer_parameters(True, routed))

    def _body_parameters(self, routed: int | None = None) -> int:
        k = self.first_k_dense_replace
        return (k * self._layer_parameters(False) + (self.num_layers - k) * self._layer_parameters(True, routed)
                + self.hidden_size)

    def num_parameters(self, head: str | None = None) -> int:
        """Every parameter of the model ``create`` builds for ``head`` (default "causal_lm"); with
        no MTP modules, what ``transformers`` counts for the same config."""
        head = self._check_head(head)
        V, h = self.vocab_size, self.hidden_size
        total = V * h + self._body_parameters()
        if head == "causal_lm":
            total += self._mtp_parameters() + (0 if self.tie_word_embeddings else V * h)
        return total

    def num_active_parameters(self, head: str | None = None) -> int:
        """Parameters one token uses: ``num_experts_per_tok`` of the routed experts per MoE layer."""
        head = self._check_head(head)
        k = self.num_experts_per_tok
        idle = (self.n_routed_experts - k) * self._expert_parameters()
        moe_layers = (self.num_layers - self.first_k_dense_replace)
        mtp = self.num_nextn_predict_layers if head == "causal_lm" else 0
        return self.num_parameters(head) - (moe_layers + mtp) * idle

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward) at ``seq_len``: ``6 N_active + attention``.

        ``N_active`` is every active parameter that multiplies on every token: the layers with
        ``num_experts_per_tok`` routed experts (the router's ``E x h`` matmul included), the final
        norm and the LM head's ``V h``, plus the MTP modules when there are any. Attention's
        ``QK^T`` (width ``qk_head_dim``) and ``AV`` (width ``v_head_dim``) count over the full
        ``s x s`` square, ``6 L H s (qk_head_dim + v_head_dim)``, as Llama's ``12 L H d s``.
        """
        if seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len}")
        k, h, V = self.num_experts_per_tok, self.hidden_size, self.vocab_size
        n = self._body_parameters(k) + V * h + self._mtp_parameters(k)
        depth = self.num_layers + self.num_nextn_predict_layers
        return 6 * n + 6 * depth * self.num_heads * seq_len * (self.qk_head_dim + self.v_head_dim)


# DeepSeek-V3's published YaRN settings (its config.json's rope_scaling).
YARN_V3 = {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
           "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}

# Shapes as DeepSeek's published config.json gives them (deepseek-ai/DeepSeek-V3, also V3-0324 and
# R1: one architecture); the tiny one keeps MLA, groups, YaRN, and dense + MoE layers at test size.
CONFIGS = {
    "deepseek-v3": DeepseekV3Config(rope_scaling=YARN_V3),
    "deepseek-v3-tiny": DeepseekV3Config(
        vocab_size=512, hidden_size=64, num_layers=4, num_heads=4, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
        first_k_dense_replace=2, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, max_position_embeddings=512,
        rope_scaling={**YARN_V3, "factor": 4, "original_max_position_embeddings": 128},
        bos_token_id=None, eos_token_id=1),
}

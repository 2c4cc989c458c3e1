"""What one Mixture-of-Experts block is (torch-free, so model configs and the planner read it)."""

from __future__ import annotations

import dataclasses

from sampan.utils.activations import check_activation

SCORE_FUNCS = ("softmax", "sigmoid")
AUX_LOSSES = ("none", "micro_batch", "global_batch", "sequence")
DROP_POLICIES = ("probs", "position")


@dataclasses.dataclass
class MoEConfig:
    """One MoE block: a router, ``num_experts`` SwiGLU experts and optional shared experts.

    Fields:
        hidden_size: width ``h`` of the tokens the block reads and writes.
        num_experts: routed experts ``E``.
        top_k: experts each token is sent to (``1 <= top_k <= num_experts``).
        expert_intermediate_size: SwiGLU width ``f`` of one routed expert.
        activation: the experts' gate activation ("silu" for SwiGLU).
        shared_intermediate_size: SwiGLU width of the shared experts every token also runs (all
            shared experts together, e.g. DeepSeek-V3's ``n_shared_experts * moe_intermediate_size``);
            0 = no shared experts.
        shared_expert_gate: Qwen2-MoE: the shared experts' output is scaled by
            ``sigmoid(Linear(h, 1)(x))`` per token.
        score_func: "softmax" (over all experts, then top-k) or "sigmoid" (DeepSeek-V3: each
            expert's affinity on its own).
        norm_topk_prob: renormalise the k chosen weights to sum to 1.
        norm_min: floor of that renormalisation's denominator (ERNIE 4.5 uses 1e-12).
        routed_scaling_factor: multiplies the routed weights after renormalisation (DeepSeek-V3:
            2.5).
        n_group: group-limited routing: the experts form ``n_group`` equal groups (1 = off) ...
        topk_group: ... and a token may only pick experts in its best ``topk_group`` groups, a
            group scoring the sum of its two best scores (DeepSeek-V3).
        score_correction_bias: aux-loss-free balancing: a per-expert bias (buffer
            ``gate.e_score_correction_bias``) added to the scores when choosing experts, not to
            the weights; ``update_expert_bias`` moves it.
        bias_update_rate: step of that bias per update (``bias += rate * sign(mean_load - load)``).
        aux_loss: load-balancing loss: "none"; "micro_batch" (Switch / GShard over the tokens of
            one call); "global_batch" (expert loads summed over data ranks through the load
            reducer, as Qwen3); "sequence" (DeepSeek-V3's sequence-wise loss, per sequence).
        aux_loss_coef: weight of that loss in the gradients (0 = computed for the metrics only).
        z_loss_coef: weight of the router z-loss, the mean over tokens of ``logsumexp(logits)^2``
            (0 = off).
        capacity_factor: None = dropless (the default); else each expert takes at most
            ``ceil(capacity_factor * tokens * top_k / num_experts)`` token copies per call and
            the rest are dropped.
        drop_policy: which copies an over-full expert drops: "probs" (lowest routing weight
            first) or "position" (latest tokens first).
    """

    hidden_size: int
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    activation: str = "silu"
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False
    score_func: str = "softmax"
    norm_topk_prob: bool = True
    norm_min: float = 1e-20
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    score_correction_bias: bool = False
    bias_update_rate: float = 1e-3
    aux_loss: str = "none"
    aux_loss_coef: float = 0.0
    z_loss_coef: float = 0.0
    capacity_factor: float | None = None
    drop_policy: str = "probs"

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_experts", "top_k", "expert_intermediate_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"MoEConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"MoEConfig.top_k={self.top_k} exceeds num_experts={self.num_experts}; "
                             "a token cannot pick more experts than there are")
        check_activation(self.activation)
        if self.shared_intermediate_size < 0:
            raise ValueError(f"MoEConfig.shared_intermediate_size must be >= 0 (0 = no shared experts), "
                             f"got {self.shared_intermediate_size}")
        if self.shared_expert_gate and self.shared_intermediate_size == 0:
            raise ValueError("MoEConfig.shared_expert_gate=True needs shared experts: set "
                             "shared_intermediate_size > 0 or drop the gate")
        self._one_of("score_func", SCORE_FUNCS)
        self._one_of("aux_loss", AUX_LOSSES)
        self._one_of("drop_policy", DROP_POLICIES)
        if self.n_group < 1 or self.num_experts % self.n_group:
            raise ValueError(f"MoEConfig.n_group={self.n_group} must be >= 1 and divide "
                             f"num_experts={self.num_experts}")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"MoEConfig.topk_group={self.topk_group} must be in [1, n_group={self.n_group}]")
        if self.n_group > 1:
            per_group = self.num_experts // self.n_group
            if per_group < 2:
                raise ValueError(f"MoEConfig: group-limited routing scores a group by its two best experts, "
                                 f"so each of the n_group={self.n_group} groups needs >= 2 experts "
                                 f"(num_experts={self.num_experts})")
            if self.topk_group * per_group < self.top_k:
                raise ValueError(f"MoEConfig: topk_group={self.topk_group} groups of {per_group} experts "
                                 f"hold fewer than top_k={self.top_k}; raise topk_group")
        for name in ("norm_min", "routed_scaling_factor", "bias_update_rate", "aux_loss_coef", "z_loss_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"MoEConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ValueError(f"MoEConfig.capacity_factor must be > 0 or None (dropless), got {self.capacity_factor}")

    def _one_of(self, name: str, allowed: tuple[str, ...]) -> None:
        if getattr(self, name) not in allowed:
            raise ValueError(f"MoEConfig.{name}={getattr(self, name)!r} is not one of {list(allowed)}")

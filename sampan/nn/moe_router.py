"""The MoE router: scores every expert for every token and picks each token's top-k."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from sampan.nn.layer import Layer
from sampan.nn.moe_config import MoEConfig


class RouterOutput(NamedTuple):
    """What the router decided for ``T`` tokens.

    ``scores [T, E]`` fp32 after the score function (softmax or sigmoid; no correction bias),
    ``topk_idx [T, k]`` int64 chosen experts, ``topk_weight [T, k]`` fp32 weights of their
    outputs (renormalised and scaled as configured), ``logits [T, E]`` fp32 before the score
    function (the z-loss reads them).
    """

    scores: torch.Tensor
    topk_idx: torch.Tensor
    topk_weight: torch.Tensor
    logits: torch.Tensor


class TopKRouter(Layer):
    """``gate.weight [E, h]``: logits in fp32, softmax or sigmoid scores, top-k selection.

    The selection may differ from the weights: with ``score_correction_bias`` a per-expert bias
    (``e_score_correction_bias``, moved by ``update_expert_bias``) is added to the scores only to
    choose experts, and group-limited routing first keeps each token's best ``topk_group`` of
    ``n_group`` groups (a group scores the sum of its two best biased scores, as DeepSeek-V3).
    The weights are always the unbiased scores of the chosen experts.
    """

    def __init__(self, config: MoEConfig):
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.top_k
        self.score_func = config.score_func
        self.norm_topk_prob = config.norm_topk_prob
        self.norm_min = config.norm_min
        self.routed_scaling_factor = config.routed_scaling_factor
        self.n_group = config.n_group
        self.topk_group = config.topk_group
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        if config.score_correction_bias:
            # A buffer, not a parameter: no optimizer touches it; it is saved with the model.
            self.register_buffer("e_score_correction_bias", torch.zeros(config.num_experts, dtype=torch.float32))
        else:
            self.e_score_correction_bias = None
        self.reset_parameters()

    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) router weights; the correction bias (if any) back to zero."""
        nn.init.normal_(self.weight, mean=0.0, std=std)
        if self.e_score_correction_bias is not None:
            self.e_score_correction_bias.zero_()

    def forward(self, x: torch.Tensor) -> RouterOutput:
        """``x [T, h]`` -> ``RouterOutput``; the math is fp32 whatever ``x``'s dtype (and autocast)."""
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.weight.float())
            scores = torch.softmax(logits, dim=-1) if self.score_func == "softmax" else torch.sigmoid(logits)
            choice = scores.detach()
            if self.e_score_correction_bias is not None:
                choice = choice + self.e_score_correction_bias.float()
            if self.n_group > 1:
                choice = self._limit_to_groups(choice)
            topk_idx = torch.topk(choice, self.top_k, dim=-1).indices
            weight = scores.gather(1, topk_idx)
            if self.norm_topk_prob:
                weight = weight / weight.sum(dim=-1, keepdim=True).clamp(min=self.norm_min)
            if self.routed_scaling_factor != 1.0:
                weight = weight * self.routed_scaling_factor
        return RouterOutput(scores, topk_idx, weight, logits)

    def _limit_to_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """``choice`` with every expert outside the token's best ``topk_group`` groups at -inf."""
        t = choice.shape[0]
        grouped = choice.view(t, self.n_group, -1)
        group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)
        best = group_score.topk(self.topk_group, dim=-1).indices
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
        return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(t, -1)

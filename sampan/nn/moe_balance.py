"""Load balancing for MoE blocks: the auxiliary losses, the router z-loss, the autograd function
that feeds them to the gradients without returning them, expert capacity (token dropping) and
the aux-loss-free bias step."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

LoadReducer = Callable[[torch.Tensor], torch.Tensor]


class MoEAuxLossAutoScaler(torch.autograd.Function):
    """``forward(output, aux_loss, scale)`` returns ``output``; backward passes ``output``'s
    gradient through and gives ``aux_loss`` the gradient ``scale``, so ``d(aux_loss)/d(params) *
    scale`` joins the parameters' gradients as if ``aux_loss`` had been added to the loss
    (Megatron-Core's ``MoEAuxLossAutoScaler``). Dense loss code, pipelines and fleet need no
    second loss."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, aux_loss: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux_loss)
        ctx.scale = scale
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (aux_loss,) = ctx.saved_tensors
        return grad_output, torch.full_like(aux_loss, ctx.scale), None


def normalized_scores(scores: torch.Tensor, score_func: str) -> torch.Tensor:
    """Each token's scores as a distribution over experts: softmax scores already are one;
    sigmoid scores are divided by their sum (DeepSeek-V3's ``s'``)."""
    if score_func == "softmax":
        return scores
    return scores / scores.sum(dim=-1, keepdim=True).clamp(min=1e-20)


def expert_counts(topk_idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Token copies routed to each expert, fp32 ``[E]`` (a scatter-add: no host sync)."""
    flat = topk_idx.reshape(-1)
    return torch.zeros(num_experts, device=flat.device, dtype=torch.float32).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.float32))


def load_balancing_loss(
    kind: str,
    probs: torch.Tensor,
    topk_idx: torch.Tensor,
    counts: torch.Tensor,
    batch_size: int,
    reducer: LoadReducer | None = None,
) -> torch.Tensor:
    """``E * sum_i f_i * P_i``: ``f_i`` the share of the token copies routed to expert ``i``
    (``count_i / (T k)``), ``P_i`` the mean of its normalised score over the tokens. It is 1 for
    a perfectly even router whatever ``k`` (Megatron-Core's and DeepSeek-V3's scale;
    transformers' ``load_balancing_loss_func`` for Qwen-MoE leaves out the ``1 / k``, so its value
    is ``k`` times this one).

    ``kind``: "micro_batch" (over the ``T`` tokens of this call), "global_batch" (``f_i`` from
    ``counts`` summed over the data ranks by ``reducer``), "sequence" (DeepSeek-V3's
    complementary sequence-wise loss: ``f`` and ``P`` per sequence of the ``[b, s]`` input, the
    loss averaged over the ``b`` sequences). ``probs [T, E]`` normalised scores, ``topk_idx
    [T, k]``, ``counts [E]`` this call's copies per expert.
    """
    num_experts = probs.shape[-1]
    if kind == "micro_batch":
        f = counts / counts.sum().clamp(min=1)
        return num_experts * (f * probs.mean(dim=0)).sum()
    if kind == "global_batch":
        total = counts.clone() if reducer is None else reducer(counts.clone())
        f = total / total.sum().clamp(min=1)
        return num_experts * (f * probs.mean(dim=0)).sum()
    if kind == "sequence":
        per_seq = topk_idx.reshape(batch_size, -1)
        seq_counts = torch.zeros(batch_size, num_experts, device=probs.device, dtype=torch.float32)
        seq_counts.scatter_add_(1, per_seq, torch.ones_like(per_seq, dtype=torch.float32))
        f = seq_counts / per_seq.shape[1]
        p = probs.reshape(batch_size, -1, num_experts).mean(dim=1)
        return (num_experts * (f * p).sum(dim=-1)).mean()
    raise ValueError(f"unknown aux_loss {kind!r}; allowed: micro_batch, global_batch, sequence")


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's z-loss: the mean over tokens of ``logsumexp(logits)^2`` (keeps logits small)."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Copies one expert may take: ``ceil(capacity_factor * tokens * top_k / num_experts)``."""
    return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


def capacity_keep_mask(
    topk_idx: torch.Tensor, topk_weight: torch.Tensor, num_experts: int, capacity: int, policy: str
) -> torch.Tensor:
    """``[T, k]`` bool: which token copies their expert keeps when it takes at most ``capacity``.

    "probs" keeps each expert's ``capacity`` highest-weight copies; "position" its earliest
    tokens. No loop over experts: sort the copies by (expert, priority), then each copy's rank
    inside its expert is its sorted position minus where the expert's run starts.
    """
    flat = topk_idx.reshape(-1)
    if policy == "probs":
        # Stable sorts: by weight (highest first), then by expert, keeps the weight order inside.
        by_weight = torch.argsort(topk_weight.reshape(-1), descending=True, stable=True)
        order = by_weight[torch.argsort(flat[by_weight], stable=True)]
    elif policy == "position":
        order = torch.argsort(flat, stable=True)  # copies are laid out token by token already
    else:
        raise ValueError(f"unknown drop_policy {policy!r}; allowed: probs, position")
    counts = torch.zeros(num_experts, device=flat.device, dtype=torch.long).scatter_add_(
        0, flat, torch.ones_like(flat))
    starts = torch.cumsum(counts, dim=0) - counts
    rank_sorted = torch.arange(flat.shape[0], device=flat.device) - starts[flat[order]]
    rank = torch.empty_like(rank_sorted).scatter_(0, order, rank_sorted)
    return (rank < capacity).view_as(topk_idx)


def bias_step(load: torch.Tensor, rate: float) -> torch.Tensor:
    """Aux-loss-free balancing (DeepSeek-V3, torchtitan): ``rate * sign(mean_load - load)``: an
    overloaded expert's bias goes down, an idle one's up."""
    return rate * torch.sign(load.mean() - load)

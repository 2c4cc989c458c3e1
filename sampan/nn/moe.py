"""The Mixture-of-Experts block (``MoE``) and the module-level functions that read and steer every
block of a model: ``moe_blocks``, ``moe_metrics``, ``update_expert_bias``, ``reset_moe_stats``,
``set_load_reducer``, ``set_aux_loss_scale``.

No parallelism lives here. Expert parallelism wraps ``MoE.experts`` (a ``GroupedExperts``) with
forward pre / post hooks that move the sorted token copies between ranks; ``MoE.forward`` calls
it exactly once for that reason. Collectives reach the block only as the injected load reducer.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from sampan.nn.layer import Layer
from sampan.nn.moe_balance import (
    LoadReducer,
    MoEAuxLossAutoScaler,
    bias_step,
    capacity_keep_mask,
    expert_capacity,
    expert_counts,
    load_balancing_loss,
    normalized_scores,
    router_z_loss,
)
from sampan.nn.moe_config import MoEConfig
from sampan.nn.moe_experts import GroupedExperts, SharedExperts
from sampan.nn.moe_planned import active_plan
from sampan.nn.moe_router import TopKRouter

__all__ = [
    "MoE",
    "moe_blocks",
    "moe_metrics",
    "reset_moe_stats",
    "set_aux_loss_scale",
    "set_load_reducer",
    "update_expert_bias",
]


class MoE(Layer):
    """``x [b, s, h] -> [b, s, h]``: route each token to ``top_k`` experts, run them, add the
    weighted outputs and the shared experts' output.

    Modules (state-dict names): ``gate`` (``TopKRouter``: ``gate.weight``, and
    ``gate.e_score_correction_bias`` with ``score_correction_bias``), ``experts``
    (``GroupedExperts``: ``experts.gate_up_proj``, ``experts.down_proj``), ``shared_experts``
    (``SharedExperts``, when ``shared_intermediate_size > 0``) and ``shared_expert_gate``
    (``Linear(h, 1)``, when ``shared_expert_gate``).

    Statistics (not in the state dict): ``tokens_per_expert`` (fp32 ``[E]``, copies the router
    sent to each expert in training forwards since the last ``update_expert_bias`` /
    ``reset_moe_stats``; the replay of a recomputed forward in backward is not counted again)
    and the last training forward's ``last_aux_loss``, ``last_z_loss`` (unweighted, 0-d
    tensors) and ``last_dropped_tokens`` (copies over capacity).
    """

    def __init__(self, config: MoEConfig):
        super().__init__()
        self.config = config
        self.num_experts = config.num_experts
        self.top_k = config.top_k
        self.gate = TopKRouter(config)
        self.experts = GroupedExperts(config)
        self.shared_experts = (
            SharedExperts(config.hidden_size, config.shared_intermediate_size, config.activation)
            if config.shared_intermediate_size else None
        )
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False) if config.shared_expert_gate else None
        self.register_buffer("tokens_per_expert", torch.zeros(config.num_experts, dtype=torch.float32),
                             persistent=False)
        self.aux_loss_scale = 1.0
        self.load_reducer: LoadReducer | None = None
        self.last_aux_loss: torch.Tensor | None = None
        self.last_z_loss: torch.Tensor | None = None
        self.last_dropped_tokens: torch.Tensor | None = None

    def reset_parameters(self, std: float = 0.02) -> None:
        """Normal(0, std) for the router and the routed experts (the shared experts are plain
        ``Linear`` layers a model's own init reaches)."""
        self.gate.reset_parameters(std)
        self.experts.reset_parameters(std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [b, s, h]`` -> ``[b, s, h]``."""
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        num_tokens = tokens.shape[0]
        route = self.gate(tokens)
        topk_idx, topk_weight = route.topk_idx, route.topk_weight
        k = topk_idx.shape[1]

        with torch.no_grad():
            routed = expert_counts(topk_idx, self.num_experts)
            flat = topk_idx.reshape(-1)
            dropped = None
            if self.config.capacity_factor is not None:
                capacity = expert_capacity(num_tokens, k, self.num_experts, self.config.capacity_factor)
                keep = capacity_keep_mask(topk_idx, topk_weight, self.num_experts, capacity,
                                          self.config.drop_policy).reshape(-1)
                # Dropped copies sort after every expert's (key E) and are cut off below.
                flat = torch.where(keep, flat, self.num_experts)
                dropped = (~keep).sum()
            # Stable: inside one expert the copies stay in token order. ONNX has no stable sort, so
            # under export the keys are made unique by the copy's position and sorted plainly.
            if torch.compiler.is_exporting():
                order = torch.argsort(flat * flat.shape[0] + torch.arange(flat.shape[0], device=flat.device))
            else:
                order = torch.argsort(flat, stable=True)
            counts = torch.zeros(self.num_experts + 1, device=flat.device, dtype=torch.long).scatter_add_(
                0, flat, torch.ones_like(flat))[: self.num_experts]
            plan = active_plan()
            if plan is not None:  # a simulation: the planned loads stand in for the router's (no values)
                counts = plan.counts(flat.shape[0], self.num_experts)
            if dropped is not None:
                # A host sync, only when tokens may drop (an unbacked size under torch.export).
                kept = counts.sum().item()
                torch._check(kept >= 0)
                torch._check(kept <= order.shape[0])
                order = order[:kept]
            token_of = torch.div(order, k, rounding_mode="floor")

        expert_out = self.experts(tokens[token_of], counts)
        weight = topk_weight.reshape(-1)[order].to(expert_out.dtype)
        out = torch.zeros(num_tokens, h, device=x.device, dtype=expert_out.dtype).index_add(
            0, token_of, expert_out * weight.unsqueeze(-1))
        if self.shared_experts is not None:
            shared = self.shared_experts(tokens)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(tokens)) * shared
            out = out + shared
        out = out.view(b, s, h).to(x.dtype)

        if self.training:
            out = self._balance(out, route, routed, b, dropped)
        return out

    def _balance(self, out: torch.Tensor, route, routed: torch.Tensor, batch_size: int,
                 dropped: torch.Tensor | None) -> torch.Tensor:
        """Record the statistics and hang the weighted balancing losses on ``out``'s gradient."""
        cfg = self.config
        # Activation recompute (torch.utils.checkpoint) replays this forward inside backward: the
        # replay must not count the tokens or record the losses again.
        replay = _in_backward()
        # Plain tensor attributes are statistics for eager runs; an exported graph keeps only
        # the buffer.
        recording = not torch.compiler.is_exporting() and not replay
        if not replay:
            with torch.no_grad():
                self.tokens_per_expert.add_(routed)
        if recording:
            self.last_dropped_tokens = dropped
        total = None
        if cfg.aux_loss != "none":
            probs = normalized_scores(route.scores, cfg.score_func)
            aux = load_balancing_loss(cfg.aux_loss, probs, route.topk_idx, routed, batch_size, self.load_reducer)
            if recording:
                self.last_aux_loss = aux.detach()
            if cfg.aux_loss_coef > 0:
                total = cfg.aux_loss_coef * aux
        if cfg.z_loss_coef > 0:
            z = router_z_loss(route.logits)
            if recording:
                self.last_z_loss = z.detach()
            total = cfg.z_loss_coef * z if total is None else total + cfg.z_loss_coef * z
        if total is not None and torch.is_grad_enabled():
            out = MoEAuxLossAutoScaler.apply(out, total, self.aux_loss_scale)
        return out


def _in_backward() -> bool:
    """Whether this forward runs inside a backward pass: a checkpointed block being recomputed
    (eager only; a compiled graph's recompute never re-runs the Python forward)."""
    return not torch.compiler.is_compiling() and torch._C._current_graph_task_id() != -1


def moe_blocks(model: nn.Module) -> list[tuple[str, MoE]]:
    """Every ``MoE`` block in ``model`` with its module name, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, MoE)]


def set_load_reducer(model: nn.Module, fn: LoadReducer | None) -> None:
    """Give every block ``fn(t) -> t summed over the data ranks`` (None = this process only).

    The "global_batch" aux loss reduces its expert counts through it in every training forward,
    and ``update_expert_bias`` the accumulated loads, so every data rank must call both alike.
    """
    for _, block in moe_blocks(model):
        block.load_reducer = fn


def set_aux_loss_scale(model: nn.Module, scale: float) -> None:
    """Multiply the balancing losses' gradient in every block by ``scale`` (default 1.0), e.g.
    ``1 / gradient_accumulation_steps`` when the main loss is divided the same way."""
    for _, block in moe_blocks(model):
        block.aux_loss_scale = float(scale)


def reset_moe_stats(model: nn.Module) -> None:
    """Zero every block's ``tokens_per_expert`` and forget its last losses and drops."""
    for _, block in moe_blocks(model):
        block.tokens_per_expert.zero_()
        block.last_aux_loss = block.last_z_loss = block.last_dropped_tokens = None


@torch.no_grad()
def update_expert_bias(model: nn.Module) -> None:
    """Aux-loss-free balancing, once per optimizer step: in every block with a correction bias,
    ``bias += rate * sign(mean_load - load)`` (an overloaded expert's bias goes down) with the
    load summed over the data ranks through the load reducer; then every block's statistics are
    reset. The loads of all blocks travel through the reducer in one tensor (one collective)."""
    blocks = [b for _, b in moe_blocks(model) if b.gate.e_score_correction_bias is not None]
    if blocks:
        loads = torch.stack([b.tokens_per_expert for b in blocks])
        reducer = blocks[0].load_reducer
        if reducer is not None:
            loads = reducer(loads)
        for block, load in zip(blocks, loads, strict=True):
            bias = block.gate.e_score_correction_bias
            bias.add_(bias_step(load, block.config.bias_update_rate).to(bias.dtype))
    reset_moe_stats(model)


def moe_metrics(model: nn.Module) -> dict[str, float]:
    """This process's MoE figures for logging (no collectives).

    ``moe/aux_loss`` and ``moe/z_loss``: the mean over blocks of the last training forward's
    unweighted losses (blocks that computed none are left out; the key is absent when no block
    did); ``moe/dropped_tokens``: copies dropped over capacity in the last forward, summed over
    blocks; ``moe/layer{i}/load_max_over_mean``: the busiest expert's load over the mean load
    since the last reset (1.0 = even), ``i`` the layer number in the block's module name
    (``model.layers.3.mlp`` -> 3; its position among the blocks when the name has none);
    ``moe/load_max_over_mean``: the worst layer's.
    """
    blocks = moe_blocks(model)
    metrics: dict[str, float] = {}
    aux = [b.last_aux_loss for _, b in blocks if b.last_aux_loss is not None]
    z = [b.last_z_loss for _, b in blocks if b.last_z_loss is not None]
    if aux:
        metrics["moe/aux_loss"] = float(torch.stack(aux).float().mean())
    if z:
        metrics["moe/z_loss"] = float(torch.stack(z).float().mean())
    metrics["moe/dropped_tokens"] = float(sum(int(b.last_dropped_tokens) for _, b in blocks
                                              if b.last_dropped_tokens is not None))
    worst = 0.0
    for position, (name, block) in enumerate(blocks):
        load = block.tokens_per_expert
        mean = float(load.mean())
        ratio = float(load.max()) / mean if mean > 0 else 0.0
        metrics[f"moe/layer{_layer_number(name, position)}/load_max_over_mean"] = ratio
        worst = max(worst, ratio)
    if blocks:
        metrics["moe/load_max_over_mean"] = worst
    return metrics


def _layer_number(name: str, position: int) -> int:
    numbers = re.findall(r"(?:^|\.)(\d+)(?=\.|$)", name)
    return int(numbers[-1]) if numbers else position

"""What the Trainer does for a Mixture-of-Experts model around each optimizer step.

* ``step_metrics``: the balancing figures of ``sampan.nn.moe.moe_metrics`` for the log
  (``moe/aux_loss``, ``moe/z_loss``, ``moe/dropped_tokens``, ``moe/load_max_over_mean`` and each
  layer's ``moe/layer{i}/load_max_over_mean``), with the expert loads summed over the data ranks
  first, so a fleet run reports the global batch's balance, not rank 0's share of it.
* ``end_step``: the aux-loss-free bias update (``update_expert_bias``) once per optimizer step when
  a block has a correction bias, else the statistics reset, so each step's loads are its own.

Both backends run them alike: the sum over the data ranks goes through the blocks' load reducer,
which fleet sets (``sampan.distributed.expert_parallel.DataRankSum``) and one process leaves unset.
Fleet's own ``DistributedModel.train_batch`` moves the bias itself; the Trainer never calls it (it
runs ``forward_backward`` and its own optimizer step), so the bias moves once per step either way.
"""

from __future__ import annotations

import torch
from torch import nn

from sampan.nn.moe import moe_blocks, moe_metrics, reset_moe_stats, set_aux_loss_scale, update_expert_bias

__all__ = ["end_step", "has_moe", "set_micro_batch_scale", "step_metrics"]


def has_moe(model: nn.Module) -> bool:
    """Whether ``model`` holds any ``sampan.nn.MoE`` block."""
    return bool(moe_blocks(model))


def set_micro_batch_scale(model: nn.Module, micro_batches: int, loss_scale: float = 1.0) -> None:
    """Weigh the balancing losses as the main loss is weighed in one process: each of a step's
    ``micro_batches`` adds its balancing loss's gradient inside backward, so each gets
    ``1 / micro_batches``, times the fp16 ``loss_scale`` the main loss was multiplied by (the
    scaler divides every gradient by it again)."""
    set_aux_loss_scale(model, loss_scale / micro_batches)


def step_metrics(model: nn.Module) -> dict[str, float]:
    """``moe_metrics(model)`` with every block's ``tokens_per_expert`` summed over the data ranks
    (one collective for all blocks) before the max / mean is taken.

    The aux loss, z-loss and dropped tokens are this rank's last forward's. A collective when the
    blocks have a load reducer: every rank must call it at the same step. The blocks' own
    statistics are left as they were (``end_step`` reduces them again for the bias).
    """
    blocks = [block for _, block in moe_blocks(model)]
    reducer = next((b.load_reducer for b in blocks if b.load_reducer is not None), None)
    if reducer is None:
        return moe_metrics(model)
    local = [b.tokens_per_expert.clone() for b in blocks]
    summed = reducer(torch.stack(local))
    try:
        for block, load in zip(blocks, summed, strict=True):
            block.tokens_per_expert.copy_(load)
        return moe_metrics(model)
    finally:
        for block, load in zip(blocks, local, strict=True):
            block.tokens_per_expert.copy_(load)


def end_step(model: nn.Module, stepped: bool) -> None:
    """After a step: ``update_expert_bias`` when the optimizer stepped and a block has a correction
    bias (a collective through the load reducer), else only reset the statistics (a step skipped
    for a non-finite loss or by the fp16 scaler moves no bias)."""
    if stepped and any(b.gate.e_score_correction_bias is not None for _, b in moe_blocks(model)):
        update_expert_bias(model)  # resets the statistics too
    else:
        reset_moe_stats(model)

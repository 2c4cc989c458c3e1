"""Global-norm gradient clipping across every parallel axis."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def global_grad_norm(parameters, pp_group=None) -> torch.Tensor:
    """The L2 norm of all gradients of the whole model, identical on every rank.

    A sharded gradient (a DTensor) contributes its full norm (``full_tensor`` of the local norms'
    reduction); a replicated plain tensor counts once, locally. Pipeline stages hold disjoint
    parameters, so their squared norms are summed over ``pp_group``.
    """
    total = torch.zeros((), dtype=torch.float64)
    for p in parameters:
        # A tied weight's second copy (the output head on the last pipeline stage) counts once.
        if p.grad is None or getattr(p, "_sampan_pipeline_duplicate", False):
            continue
        norm = torch.linalg.vector_norm(p.grad, 2)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total = total + norm.to(torch.float64).cpu() ** 2
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt()


class HybridClipGradByGlobalNorm:
    """``ClipGradByGlobalNorm`` for hybrid-parallel models: the same result as one process would get.

    ``distributed_optimizer`` installs it in place of a ``sampan.nn.ClipGradByGlobalNorm``.
    """

    def __init__(self, clip_norm: float, pp_group=None):
        if not clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        self.clip_norm = float(clip_norm)
        self.pp_group = pp_group

    def __call__(self, parameters) -> torch.Tensor:
        parameters = [p for p in parameters if p.grad is not None]
        total = global_grad_norm(parameters, self.pp_group)
        coef = self.clip_norm / (float(total) + 1e-6)
        if coef < 1.0 and math.isfinite(coef):
            for p in parameters:
                p.grad.mul_(coef)
        return total

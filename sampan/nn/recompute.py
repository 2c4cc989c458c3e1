"""Activation recompute (gradient checkpointing), applied to a model from outside.

Model code carries no recompute logic: ``apply_recompute`` wraps the forward of each transformer
block with non-reentrant ``torch.utils.checkpoint``.

* "full": a block stores only its input; everything inside is recomputed in backward.
* "selective": a block stores the outputs of its matmuls and of attention, and recomputes the
  cheap element-wise ops (LayerNorm, GELU, dropout, residual adds, reshapes). This is op-level
  selective checkpointing as in torchtitan. It is not Megatron's "recompute only the attention
  core": with ``scaled_dot_product_attention`` the core no longer keeps the ``s x s``
  probabilities (flash / memory-efficient kernels keep O(s) state), so recomputing it alone would
  save almost nothing.
"""

from __future__ import annotations

import types

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from sampan.nn.transformer import TransformerBlock


def _compute_intensive_ops() -> set:
    names = ["mm", "addmm", "bmm", "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable"]
    ops = set()
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None:
            ops.add(packet.default)
    return ops


_SAVE_OPS = _compute_intensive_ops()


def _selective_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_selective_policy)


def recompute_targets(model: nn.Module) -> list[nn.Module]:
    """The blocks to wrap: sampan ``TransformerBlock``s, else every element of every ``ModuleList``."""
    blocks = [m for m in model.modules() if isinstance(m, TransformerBlock)]
    if blocks:
        return blocks
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


def _recompute_forward(self: nn.Module, *args, **kwargs):
    """Installed as a block's bound ``forward``: the class forward under ``checkpoint``.

    It is a bound method of the block itself (not a closure over it), so ``copy.deepcopy`` and
    pickling give a copy that runs its own weights.
    """
    forward = type(self).forward.__get__(self)
    # Nothing to save for backward without grad (eval, generation): run it plainly.
    if not torch.is_grad_enabled():
        return forward(*args, **kwargs)
    extra = {"context_fn": _selective_context} if self._sampan_recompute == "selective" else {}
    return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)


def apply_recompute(model: nn.Module, mode: str) -> int:
    """Wrap ``model``'s blocks for ``mode`` ("none", "full", "selective"); returns how many.

    Idempotent per mode; switching mode rewraps. State-dict keys do not change.
    """
    if mode not in ("none", "full", "selective"):
        raise ValueError(f"recompute mode must be 'none', 'full' or 'selective', got {mode!r}")
    targets = recompute_targets(model)
    for block in targets:
        if "_sampan_recompute" in block.__dict__:
            del block.forward  # drop the instance override; the class forward shows through again
            del block._sampan_recompute
        if mode != "none":
            block._sampan_recompute = mode
            block.forward = types.MethodType(_recompute_forward, block)
    return len(targets) if mode != "none" else 0

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
* "moe": only the Mixture-of-Experts blocks (``sampan.nn.MoE``: router, dispatch, experts,
  combine) are recomputed whole; attention and the dense MLPs keep their activations. An MoE
  block's token copies (``top_k`` per token, ``expert_intermediate_size`` wide inside each expert)
  are most of an MoE layer's activations while its FLOPs per token are a dense layer's, so this
  frees most of that memory for one more forward of the cheap part (Megatron-Core's
  ``--recompute-modules moe``). The block does not count its tokens again when it is replayed.

``offload=True`` (Paddle's ``recompute_configs["enable_offload"]``) also moves what a recomputed
block keeps of its input to host memory during forward and brings it back when backward recomputes
the block: the device then holds none of the blocks' inputs for the micro-batches in flight, at the
price of one device-to-host and one host-to-device copy of each per step. The copies run on the
compute stream (no overlap with the kernels), into pinned memory when the block runs on a GPU.
The host is the CPU; ``sampan simulate`` points it at the meta device (:func:`offload_host`) so
that the offloaded bytes leave its device count, as they leave a GPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import types
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from sampan.nn.moe import MoE
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
# "moe": only the Mixture-of-Experts blocks, recomputed whole.
RECOMPUTE_MODES = ("none", "full", "selective", "moe")


def _selective_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_selective_policy)


_HOST: contextvars.ContextVar[str] = contextvars.ContextVar("sampan_offload_host", default="cpu")


@contextlib.contextmanager
def offload_host(device: str) -> Iterator[None]:
    """Within the block, offloaded activations go to ``device`` instead of the CPU."""
    token = _HOST.set(device)
    try:
        yield
    finally:
        _HOST.reset(token)


def _to_host(x: torch.Tensor) -> torch.Tensor:
    """A copy of ``x`` on the host, differentiably (the gradient flows back to ``x``'s device).

    Always a copy, even where the host is ``x``'s device (CPU training): the autograd graph is then
    the one a GPU run builds, and the caller's tensor is still freed once the caller drops it.
    """
    host = torch.device(_HOST.get())
    if x.device.type == "cuda" and host.type == "cpu" and type(x) is torch.Tensor:
        # Pinned memory lets the copy run asynchronously on the compute stream; copy_ records autograd.
        return torch.empty(x.shape, dtype=x.dtype, device=host, pin_memory=True).copy_(x, non_blocking=True)
    return x.to(host, copy=True)


def _offloaded(forward, device: torch.device):
    """``forward`` taking its first argument from the host: moved back to ``device`` when it runs
    (in forward, and again when backward recomputes it)."""

    def run(held: torch.Tensor, *args, **kwargs):
        return forward(held.to(device, non_blocking=True), *args, **kwargs)

    return run


def recompute_targets(model: nn.Module, mode: str = "full") -> list[nn.Module]:
    """The blocks to wrap: with ``mode`` "moe" every ``sampan.nn.MoE`` block; else sampan
    ``TransformerBlock``s, or every element of every ``ModuleList`` when there are none."""
    if mode == "moe":
        return [m for m in model.modules() if isinstance(m, MoE)]
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
    if self._sampan_offload and args and isinstance(args[0], torch.Tensor):
        # The checkpoint keeps its arguments for the recompute: hand it the host copy of the input,
        # so the device copy is freed once the caller drops it.
        x, *rest = args
        return checkpoint(_offloaded(forward, x.device), _to_host(x), *rest, use_reentrant=False, **extra, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)


def apply_recompute(model: nn.Module, mode: str, offload: bool = False) -> int:
    """Wrap ``model``'s blocks for ``mode`` ("none", "full", "selective", or "moe": the MoE
    blocks only); returns how many.

    ``offload``: keep each block's input on the host between forward and backward (needs a
    recompute mode: without one a block keeps far more than its input). Idempotent per mode;
    switching mode rewraps (from "moe" to a block mode and back too: one kind of block is wrapped
    at a time). State-dict keys do not change.
    """
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute mode must be 'none', 'full' or 'selective' (or 'moe': the MoE blocks only), "
                         f"got {mode!r}")
    if offload and mode == "none":
        raise ValueError("activation offload moves the inputs that recomputed blocks keep to the host, so it needs "
                         "recompute: set recompute to 'full' (or 'selective', 'moe'), or turn offload off")
    targets = recompute_targets(model, mode)
    if mode == "moe" and not targets:
        raise ValueError(f"recompute 'moe' recomputes the Mixture-of-Experts blocks, and {type(model).__name__} has "
                         "none (no sampan.nn.MoE): use 'full' or 'selective' for a dense model")
    # Whatever an earlier call wrapped goes first: one kind of block at a time (a checkpointed MoE
    # block inside a checkpointed layer would run three times).
    for block in [m for m in model.modules() if "_sampan_recompute" in m.__dict__]:
        del block.forward  # drop the instance override; the class forward shows through again
        del block._sampan_recompute
        del block._sampan_offload
    for block in targets:
        if mode != "none":
            block._sampan_recompute = mode
            block._sampan_offload = offload
            block.forward = types.MethodType(_recompute_forward, block)
    return len(targets) if mode != "none" else 0

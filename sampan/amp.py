"""Automatic mixed precision with Paddle's names over ``torch.autocast`` and ``torch.amp.GradScaler``."""

from __future__ import annotations

import contextlib

import torch

from sampan.tensor import DTypeLike, to_dtype


def auto_cast(enable: bool = True, dtype: DTypeLike = "bfloat16", device_type: str = "cpu"):
    """Context manager running eligible ops (matmuls, attention) in ``dtype``.

    bf16 is the fast path on this CPU and on modern GPUs; fp16 needs a :class:`GradScaler`.
    """
    if not enable:
        return contextlib.nullcontext()
    dtype = to_dtype(dtype)
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"auto_cast dtype must be bfloat16 or float16, got {dtype}")
    return torch.autocast(device_type=device_type, dtype=dtype)


def GradScaler(device_type: str = "cpu", init_loss_scaling: float = 2.0**16, incr_ratio: float = 2.0,
               decr_ratio: float = 0.5, incr_every_n_steps: int = 2000, enable: bool = True):
    """Dynamic loss scaling for fp16: a step with inf/nan gradients is skipped and the scale lowered.

    Returns a ``torch.amp.GradScaler`` for ``device_type`` (the bare ``GradScaler()`` assumes CUDA
    and disables itself on a CPU machine).
    """
    return torch.amp.GradScaler(device_type, init_scale=init_loss_scaling, growth_factor=incr_ratio,
                                backoff_factor=decr_ratio, growth_interval=incr_every_n_steps, enabled=enable)

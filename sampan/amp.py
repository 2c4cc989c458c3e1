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



def resolve_amp(amp: str | None, device: torch.device | str) -> str | None:
    """The AMP mode a run on ``device`` uses for ``amp`` ("auto", "bf16", "fp16" or None for fp32).

    "auto" is bf16 on a GPU that has bf16 units (Ampere and later), fp16 (with loss scaling) on an
    older one; on the CPU it is bf16 only when this CPU's bf16 matmuls outrun its fp32 ones
    (AVX512-BF16 / AMX), else fp32: an AVX2-only CPU emulates bf16 far slower than fp32 (0.9 against
    55 GFLOP/s measured on an EPYC), so fp32 is both the faster and the more exact choice there.
    Other values pass through unchanged.
    """
    if amp != "auto":
        return amp
    device = torch.device(device)
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if device.type != "cpu":
        return None
    return "bf16" if cpu_bf16_is_fast() else None


_CPU_GEMM_RATES: tuple[float, float] | None = None


def cpu_gemm_rates() -> tuple[float, float]:
    """This CPU's (bf16, fp32) FLOP/s on a small GEMM, measured once per process (~0.1 s)."""
    global _CPU_GEMM_RATES
    if _CPU_GEMM_RATES is None:
        from sampan.utils.hardware import measure_gemm_flops

        _CPU_GEMM_RATES = (measure_gemm_flops(torch.bfloat16, size=256, seconds=0.05),
                           measure_gemm_flops(torch.float32, size=256, seconds=0.05))
    return _CPU_GEMM_RATES


def cpu_bf16_is_fast() -> bool:
    """Whether bf16 GEMMs beat fp32 ones on this CPU (``cpu_gemm_rates``)."""
    bf16, fp32 = cpu_gemm_rates()
    return bf16 > fp32

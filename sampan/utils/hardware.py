"""What this machine can do: measured peak GEMM throughput and process memory."""

from __future__ import annotations

import os
import time
from functools import lru_cache

import torch


@lru_cache(maxsize=8)
def measure_gemm_flops(dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 0.3) -> float:
    """Best observed FLOP/s of a ``size x size`` matmul in ``dtype`` on the CPU (cached per process).

    Uses its own generator, so measuring never shifts the global RNG (which would break
    bit-exact resume of a training run).
    """
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    torch.mm(a, b)  # warm-up: first call pays for allocation and kernel selection
    best = float("inf")
    deadline = time.perf_counter() + seconds
    runs = 0
    while runs < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
        runs += 1
    return 2 * size**3 / best


def process_memory_mb() -> float:
    """Resident memory of this process in MiB (Linux ``/proc``; 0.0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0

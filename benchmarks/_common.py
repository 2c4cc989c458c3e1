"""Shared helpers for ``benchmarks/*.py``: interleaved timing, GEMM peak, machine info, JSON output.

Benchmarks compare sampan with a plain-PyTorch baseline in one run. Absolute times on a small
shared CPU machine are noise; ratios measured with interleaved blocks (so drift and neighbours hit
both sides alike) are what we report.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "Timing",
    "apply_presets",
    "time_interleaved",
    "gemm_peak_gflops",
    "load_average",
    "machine_info",
    "set_threads",
    "timestamp",
    "write_json_atomic",
]


class Timing:
    """Per-step seconds of one contender, one entry per timed block."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.per_step: list[float] = []

    @property
    def median(self) -> float:
        return statistics.median(self.per_step)

    @property
    def min(self) -> float:
        return min(self.per_step)

    def as_dict(self) -> dict[str, Any]:
        return {
            "median_step_s": self.median,
            "min_step_s": self.min,
            "per_block_step_s": self.per_step,
        }


def time_interleaved(
    contenders: Mapping[str, Callable[[], Any]],
    steps: int,
    repeats: int,
    warmup: int = 1,
) -> dict[str, Timing]:
    """Time each callable in alternating blocks of ``steps`` calls, ``repeats`` blocks each.

    Every contender first runs ``warmup`` untimed calls. Then each repeat runs one block per
    contender; the order flips every repeat (A B, B A, A B, ...) so neither side always runs
    right after the other's allocations. The garbage collector is collected before and disabled
    during each block. Returns ``name -> Timing`` with per-step seconds of each block.
    """
    if steps < 1 or repeats < 1:
        raise ValueError(f"steps and repeats must be >= 1, got steps={steps}, repeats={repeats}")
    names = list(contenders)
    for name in names:
        for _ in range(warmup):
            contenders[name]()
    timings = {name: Timing(name) for name in names}
    for r in range(repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            fn = contenders[name]
            gc.collect()
            gc.disable()
            try:
                start = time.perf_counter()
                for _ in range(steps):
                    fn()
                elapsed = time.perf_counter() - start
            finally:
                gc.enable()
            timings[name].per_step.append(elapsed / steps)
    return timings


def apply_presets(args: Any, preset: Mapping[str, Any], default_out: Any) -> Any:
    """Fill each argument left at None from ``preset`` (the full or the ``--quick`` shapes), and
    ``args.out`` from ``default_out`` when not given; returns ``args``."""
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None:
        args.out = default_out
    return args


def gemm_peak_gflops(n: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Best-of-``repeats`` GFLOP/s of an ``n x n @ n x n`` ``torch.matmul`` (``2 n^3`` FLOPs)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(dtype)
    b = torch.randn(n, n, generator=gen).to(dtype)
    out = torch.empty(n, n, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm-up: thread pool, page faults
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count when given; return the count in use."""
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "processor": platform.processor() or platform.machine(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "loadavg_1_5_15": load_average(),
    }


def load_average() -> list[float] | None:
    """The 1/5/15-minute load averages (other jobs on a small machine skew timings), None if unknown."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def command_line(argv: list[str] | None) -> str:
    """The command that made a result: ``python SCRIPT ARGS`` (``argv`` as given to ``main``, else the
    process's own arguments)."""
    return "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])


def timestamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """Write ``data`` as JSON to ``path`` through a temp file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path

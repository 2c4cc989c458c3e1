"""What this machine can do: the peak FLOP/s that MFU divides by, GEMM throughput, process memory.

MFU (model FLOPs utilization) is the model's FLOPs per second over the hardware's peak. The peak
must not move with the run, or MFU means nothing; :func:`device_peak_flops` gives it:

* **GPUs**: the vendor's datasheet figure for dense (not sparse) matmuls in the training dtype,
  looked up by ``torch.cuda.get_device_name`` (:func:`datasheet_peak_flops`): e.g. H100 SXM / H200
  989 TFLOP/s bf16, A100 312. fp32 uses the plain fp32 figure, or the TF32 one when
  ``torch.backends.cuda.matmul.allow_tf32`` is on. A device not in the table gives None (with a
  warning): MFU is then not reported; pass ``TrainingArguments(peak_flops=...)`` to get it.
* **CPUs**: no datasheet figure applies (clocks, cores and SIMD units vary per machine), so the
  peak is measured: square matmuls of growing size (256 ... 4096, stopping before one matmul would
  take over 0.5 s or the whole would pass about 4 s), each the best of at least 5 timings and
  0.2 s, the peak the best rate of all (:func:`measure_cpu_peak_flops`; here, a shared 2-core AMD
  EPYC, 54-177 GFLOP/s fp32 on 2 threads depending on load, about 100 on 1 thread). It is measured
  once per machine and cached in
  ``$SAMPAN_HOME/cache/hardware/cpu_peak_flops.json``, keyed by CPU model, torch version, CPU
  capability, thread count and dtype (:func:`cpu_peak_key`); delete the file, or call
  ``cpu_peak_flops(dtype, remeasure=True)``, to measure again (e.g. after a measurement on a busy
  machine).

MFU is never clamped: over 100% means the FLOP count or the peak is wrong, and is shown as such.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import platform
import re
import time
import warnings
from functools import lru_cache
from pathlib import Path

import torch

from sampan.utils.atomic import atomic_write
from sampan.utils.paths import cache_dir


@lru_cache(maxsize=8)
def measure_gemm_flops(dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 0.3) -> float:
    """Best observed FLOP/s of a ``size x size`` matmul in ``dtype`` on the CPU (cached per process):
    a quick rate for comparisons. MFU uses :func:`device_peak_flops`.

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


# Datasheet peaks in TFLOP/s of one device, dense (the sparse figures vendors headline are twice
# these): (pattern of the device name, bf16, fp16, fp32, tf32). None: the device has no such units
# (bf16 / fp16: no MFU for that dtype; tf32: fp32 matmuls run at the fp32 figure). Sources: NVIDIA's
# A100, A10, A30, L4, L40, L40S, H100 (SXM / PCIe / NVL), H200, H20, GH200, Blackwell and V100 / T4
# datasheets; AMD's Instinct MI250X (per GCD, as torch sees it), MI300X and MI325X pages. The
# first pattern that matches (case-insensitive ``re.search``) wins, so the more specific come first.
GPU_PEAK_TFLOPS: tuple[tuple[str, float | None, float | None, float | None, float | None], ...] = (
    (r"\bGH200\b", 989.0, 989.0, 67.0, 494.5),
    (r"\bH200\b.*\bNVL\b", 835.0, 835.0, 60.0, 417.5),
    (r"\bH200\b", 989.0, 989.0, 67.0, 494.5),
    (r"\bH100\b.*\bNVL\b", 835.0, 835.0, 60.0, 417.5),
    (r"\bH100\b.*\bPCIe\b", 756.0, 756.0, 51.0, 378.0),
    (r"\bH100\b", 989.0, 989.0, 67.0, 494.5),  # SXM ("NVIDIA H100 80GB HBM3") and other variants
    (r"\bH800\b.*\bPCIe\b", 756.0, 756.0, 51.0, 378.0),
    (r"\bH800\b", 989.0, 989.0, 67.0, 494.5),
    (r"\bH20\b", 148.0, 148.0, 44.0, 74.0),
    (r"\bB200\b", 2250.0, 2250.0, None, None),  # fp32 / tf32: not tabulated per GPU here
    (r"\bA100\b", 312.0, 312.0, 19.5, 156.0),
    (r"\bA800\b", 312.0, 312.0, 19.5, 156.0),
    (r"\bA30\b", 165.0, 165.0, 10.3, 82.0),
    (r"\bA10\b", 125.0, 125.0, 31.2, 62.5),
    (r"\bL40S\b", 362.0, 362.0, 91.6, 183.0),
    (r"\bL40\b", 181.0, 181.0, 90.5, 90.5),
    (r"\bL4\b", 121.0, 121.0, 30.3, 60.0),
    (r"\bV100\b.*\bPCIE\b", None, 112.0, 14.0, None),
    (r"\bV100\b", None, 125.0, 15.7, None),
    (r"\bT4\b", None, 65.0, 8.1, None),
    (r"\bMI325X\b", 1307.4, 1307.4, 163.4, None),
    (r"\bMI300X\b", 1307.4, 1307.4, 163.4, None),
    (r"\bMI250X\b", 191.5, 191.5, 47.9, None),
)


def datasheet_peak_flops(device_name: str, dtype: torch.dtype = torch.bfloat16, *, tf32: bool = False) -> float | None:
    """The datasheet dense peak FLOP/s of one device called ``device_name`` for matmuls in
    ``dtype`` (TF32 tensor cores for fp32 when ``tf32``); None for a device or dtype not in
    :data:`GPU_PEAK_TFLOPS`."""
    column = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}.get(dtype)
    if column is None:
        return None
    for row in GPU_PEAK_TFLOPS:
        if re.search(row[0], device_name, flags=re.IGNORECASE):
            tflops = row[4] if column == 3 and tf32 and row[4] is not None else row[column]
            return None if tflops is None else tflops * 1e12
    return None


def device_peak_flops(device: torch.device | str, dtype: torch.dtype = torch.float32) -> float | None:
    """The peak FLOP/s of one ``device`` for ``dtype`` matmuls, the denominator of MFU: the
    datasheet figure on a GPU, the measured (cached) GEMM peak on the CPU, None when unknown."""
    device = torch.device(device)
    if device.type == "cpu":
        return cpu_peak_flops(dtype)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
        peak = datasheet_peak_flops(name, dtype, tf32=tf32)
        if peak is None:
            warnings.warn(f"{name!r} ({_dtype_name(dtype)}) is not in sampan's datasheet table "
                          "(sampan.utils.hardware.GPU_PEAK_TFLOPS), so MFU is not reported; pass "
                          "TrainingArguments(peak_flops=...) with one device's dense peak FLOP/s to get it",
                          RuntimeWarning, stacklevel=2)
        return peak
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cpu_model() -> str:
    """This machine's CPU model name (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Hardware", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def cpu_peak_key(dtype: torch.dtype = torch.float32, threads: int | None = None) -> str:
    """The cache key of a CPU GEMM peak: CPU model, torch version, CPU capability, threads, dtype."""
    threads = torch.get_num_threads() if threads is None else threads
    return (f"{cpu_model()} | torch {torch.__version__} | {torch.backends.cpu.get_cpu_capability()} | "
            f"{threads} threads | {_dtype_name(dtype)}")


def cpu_peak_cache_path() -> Path:
    """``$SAMPAN_HOME/cache/hardware/cpu_peak_flops.json``: the measured CPU peaks, by key."""
    return cache_dir("hardware") / "cpu_peak_flops.json"


def _read_peaks(path: Path) -> dict:
    try:
        peaks = json.loads(path.read_text(encoding="utf-8")).get("peaks", {})
    except (OSError, ValueError, AttributeError):
        return {}  # missing or damaged: measure again, and write a good file
    return peaks if isinstance(peaks, dict) else {}


def cpu_peak_flops(dtype: torch.dtype = torch.float32, *, remeasure: bool = False) -> float:
    """The CPU's peak GEMM FLOP/s in ``dtype`` at the current thread count: read from the cache,
    or measured (:func:`measure_cpu_peak_flops`) and cached when not there (or ``remeasure``)."""
    path, key = cpu_peak_cache_path(), cpu_peak_key(dtype)
    peaks = _read_peaks(path)
    entry = peaks.get(key)
    if not remeasure and isinstance(entry, dict):
        flops = entry.get("flops")
        if isinstance(flops, (int, float)) and math.isfinite(flops) and flops > 0:
            return float(flops)
    if not remeasure and key in _MEASURED_UNDER_LOAD:
        return _MEASURED_UNDER_LOAD[key]
    flops = measure_cpu_peak_flops(dtype)
    if _busy():
        # Other processes on the cores make the peak come out low; a low cached peak would then
        # show every later run above 100% MFU. Measured under load, the figure serves this process
        # only (kept in memory, so its later runs do not measure again).
        _MEASURED_UNDER_LOAD[key] = flops
        return flops
    peaks = _read_peaks(path)  # another process may have added its own meanwhile
    peaks[key] = {"flops": flops, "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        atomic_write(path, json.dumps({"version": 1, "peaks": peaks}, indent=1, sort_keys=True) + "\n")
    except OSError as err:  # a read-only home: the figure still serves this process
        warnings.warn(f"could not cache the measured CPU peak in {path}: {err}", RuntimeWarning, stacklevel=2)
    return flops


_MEASURED_UNDER_LOAD: dict[str, float] = {}


def _busy() -> bool:
    """Whether other work holds the CPU: the 1-minute load average above half the cores."""
    try:
        return os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1)
    except OSError:  # no load average on this platform: trust the measurement
        return False


def forget_cpu_peak(dtype: torch.dtype = torch.float32) -> None:
    """Drop the cached CPU peak for ``dtype`` at the current thread count, so the next run measures
    again (the Trainer does this when a run goes faster than the cached peak)."""
    path, key = cpu_peak_cache_path(), cpu_peak_key(dtype)
    _MEASURED_UNDER_LOAD.pop(key, None)
    peaks = _read_peaks(path)
    if peaks.pop(key, None) is not None:
        with contextlib.suppress(OSError):
            atomic_write(path, json.dumps({"version": 1, "peaks": peaks}, indent=1, sort_keys=True) + "\n")


CPU_PEAK_SIZES = (256, 512, 1024, 2048, 4096)


def gemm_rates(dtype: torch.dtype = torch.float32, sizes: tuple[int, ...] = CPU_PEAK_SIZES, repeats: int = 5,
               max_matmul_seconds: float = 0.5, min_seconds: float = 0.2,
               budget_seconds: float = 4.0) -> dict[int, float]:
    """FLOP/s of an ``n x n`` CPU matmul in ``dtype`` for each ``n`` of ``sizes`` (ascending),
    each the best of at least ``repeats`` timings after one warm-up, and of as many more as fit in
    ``min_seconds`` (more chances of a run other processes did not slow). A size is left out, and
    so are the larger ones, once one matmul of it would take over ``max_matmul_seconds`` at the
    best rate so far, or when its timings would end past ``budget_seconds`` in all (at least one
    size is measured).

    Uses its own generator, so measuring never shifts the global RNG.
    """
    gen = torch.Generator().manual_seed(0)
    rates: dict[int, float] = {}
    began_all = time.perf_counter()
    for n in sorted(sizes):
        if rates:
            matmul = 2 * n**3 / max(rates.values())  # seconds, at the best rate so far
            spent = time.perf_counter() - began_all
            if matmul > max_matmul_seconds or spent + matmul * (repeats + 1) > budget_seconds:
                break
        a = torch.randn(n, n, generator=gen).to(dtype)
        b = torch.randn(n, n, generator=gen).to(dtype)
        torch.mm(a, b)  # warm-up: allocation and kernel selection
        best, runs, began = float("inf"), 0, time.perf_counter()
        while runs < max(1, repeats) or time.perf_counter() - began < min_seconds:
            start = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - start)
            runs += 1
        rates[n] = 2 * n**3 / max(best, 1e-12)
    return rates


def measure_cpu_peak_flops(dtype: torch.dtype = torch.float32, **kwargs) -> float:
    """The CPU's peak GEMM FLOP/s in ``dtype``: the best rate of :func:`gemm_rates` (uncached)."""
    return max(gemm_rates(dtype, **kwargs).values())


def process_memory_mb() -> float:
    """Resident memory of this process in MiB (Linux ``/proc``; 0.0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0

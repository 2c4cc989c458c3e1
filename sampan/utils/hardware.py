"""What this machine can do: the peak FLOP/s that MFU divides by, GEMM throughput, process memory.

MFU (model FLOPs utilization) is the model's FLOPs per second over the hardware's peak. The peak
must not move with the run or with the machine's load, or MFU means nothing;
:func:`device_peak_flops` gives it:

* **GPUs**: the vendor's datasheet figure for dense (not sparse) matmuls in the training dtype,
  looked up by ``torch.cuda.get_device_name`` (:func:`datasheet_peak_flops`): e.g. H100 SXM / H200
  989 TFLOP/s bf16, A100 312. fp32 uses the plain fp32 figure, or the TF32 one when
  ``torch.backends.cuda.matmul.allow_tf32`` is on. A device not in the table gives None (with a
  warning): MFU is then not reported; pass ``TrainingArguments(peak_flops=...)`` to get it.
* **CPUs**: the processor's own peak, worked out as a datasheet works it out, never timed
  (:func:`cpu_peak`): FLOPs per cycle of one core x cores in use x the highest clock.

  - *FLOPs per cycle* (:data:`CPU_SIMD_RULES`, matched on ``/proc/cpuinfo``'s flags, vendor,
    family and model name): in fp32, vector bits / 32 x 2 (a fused multiply-add is two FLOPs) x
    FMA units; 64 on an AVX-512 core with two FMA units, 32 on AVX2 (Haswell and later, AMD Zen 2 /
    3) and on Zen 4 (AVX-512 executed as two 256-bit halves). bf16 runs at the AMX tile rate where
    there are tiles (``amx_bf16``: 1024 FLOPs per cycle), else at twice fp32 with ``avx512_bf16``
    (``VDPBF16PS`` adds two products into each fp32 lane), else at the fp32 rate (bf16 is widened
    and multiplied in fp32); fp16 likewise with ``amx_fp16`` / ``avx512_fp16``, else the fp32 rate
    (F16C widens it; torch's own fp16 CPU matmul is far slower still). Where the table cannot tell
    two parts apart it takes the faster one, so MFU may read low but not above 100%.
  - *Cores*: ``torch.get_num_threads()``, capped by the physical cores this process may run on
    (``os.sched_getaffinity`` and ``/proc/cpuinfo``'s core ids: hyper-threads share their core's
    FMA units).
  - *Clock*: the highest the core runs at, as GPU datasheets quote the boost clock:
    ``cpuinfo_max_freq`` under ``/sys/devices/system/cpu/cpu*/cpufreq`` where the kernel's driver
    reports turbo in it; otherwise (virtual machines show no cpufreq) the nominal clock, from the
    model name's "@ 2.40GHz" or else ``cpu MHz``, times :data:`TURBO_ALLOWANCE`, since the cores
    may turbo above it and a measured rate beat the nominal-clock peak here.
  - With no clock at all (ARM's ``/proc/cpuinfo`` has none; no ``/proc`` off Linux), with flags
    the table does not know, or for other dtypes, the peak is None: no MFU, with a warning, as for
    an unknown GPU; ``TrainingArguments(peak_flops=...)`` sets it. A measured GEMM rate is not put
    in its place: it moves with the load.

  Here (a 2-vCPU KVM guest of an Intel Xeon with AVX-512, AMX and ``cpu MHz`` 2600, no cpufreq):
  2.6 GHz x 2 = 5.2 GHz; fp32 at 64 FLOPs per cycle: 333 GFLOP/s on 1 thread, 666 on 2 (torch's
  GEMM measured at best 176 and 308: the 1-thread rate beats the 166 of the nominal clock, so the
  cores do turbo); bf16 on AMX at 1024: 5.3 TFLOP/s on 1 thread, 10.6 on 2 (measured at best 1.26
  and 1.29).

A measured GEMM rate (:func:`measure_gemm_flops`, :func:`gemm_rates`) is a second, different
figure: what torch's kernels reach on this machine at this moment. It is measured beside the work
it is compared with (``benchmarks/gpu.py``'s ``gemm_share``), never kept on disk, never MFU's
denominator (:func:`measure_gemm_flops` keeps one per process for ``amp="auto"``'s choice of bf16).

MFU is never clamped: over 100% means the FLOP count or the peak is wrong, and is shown as such.
"""

from __future__ import annotations

import os
import platform
import re
import time
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

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
    datasheet figure on a GPU, the processor's figure (:func:`cpu_peak_flops`) on the CPU, None
    when unknown."""
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


# --- the CPU's peak, from what the processor is -----------------------------------------------------
@dataclass(frozen=True)
class CpuInfo:
    """What ``/proc/cpuinfo`` says about the processor (:func:`parse_cpuinfo`)."""

    model_name: str
    vendor: str  # "GenuineIntel", "AuthenticAMD", "HygonGenuine"; "" where not given (ARM)
    family: int | None
    model: int | None
    flags: frozenset[str]  # x86 "flags", ARM "Features"
    mhz: float | None  # the highest "cpu MHz" line; None where there is none
    core_of: dict[int, tuple[str, str]]  # logical CPU -> (physical id, core id), where given


def parse_cpuinfo(text: str) -> CpuInfo:
    """Read the text of ``/proc/cpuinfo`` (one block per logical CPU, blank-line separated)."""
    blocks = []
    for chunk in re.split(r"\n\s*\n", text):
        fields = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
        if fields:
            blocks.append(fields)
    first = next((b for b in blocks if "flags" in b or "Features" in b), blocks[0] if blocks else {})

    def number(value: str | None) -> int | None:  # decimal on x86, hex ("0x41") in ARM's fields
        try:
            return int(value, 16) if value.lower().startswith("0x") else int(value)
        except (AttributeError, ValueError):
            return None

    def mhz_of(block: dict) -> float:
        try:
            return float(block.get("cpu MHz", "0"))
        except ValueError:
            return 0.0

    mhz = [m for m in map(mhz_of, blocks) if m > 0]
    core_of = {}
    for b in blocks:
        cpu = number(b.get("processor"))
        if cpu is not None and "core id" in b:
            core_of[cpu] = (b.get("physical id", "0"), b["core id"])
    return CpuInfo(model_name=first.get("model name", first.get("Hardware", "")), vendor=first.get("vendor_id", ""),
                   family=number(first.get("cpu family")), model=number(first.get("model")),
                   flags=frozenset((first.get("flags") or first.get("Features") or "").split()),
                   mhz=max(mhz) if mhz else None, core_of=core_of)


@dataclass(frozen=True)
class SimdRule:
    """One row of :data:`CPU_SIMD_RULES`: the fp32 FMA datapath of one core of the CPUs it matches
    (all of its given conditions hold)."""

    label: str
    vector_bits: int
    fma_units: int  # for parts without FMA: the multiply + add pairs issued per cycle
    flags: frozenset[str] = frozenset()
    vendors: tuple[str, ...] = ()
    families: tuple[int, ...] = ()
    below_model: int | None = None  # the "model" number is below this
    name: str | None = None  # ``re.search`` on the model name

    def matches(self, cpu: CpuInfo) -> bool:
        return (self.flags <= cpu.flags and (not self.vendors or cpu.vendor in self.vendors)
                and (not self.families or cpu.family in self.families)
                and (self.below_model is None or (cpu.model is not None and cpu.model < self.below_model))
                and (self.name is None or re.search(self.name, cpu.model_name) is not None))


_INTEL, _AMD = ("GenuineIntel",), ("AuthenticAMD", "HygonGenuine")
# The first row that matches wins, so the exceptions come before the general rows. Sources: Intel's
# optimization manual and ark.intel.com ("# of AVX-512 FMA Units"), AMD's Zen software
# optimization guides, Arm's Neoverse software optimization guides. A part the rows cannot tell
# from a faster one gets the faster figure (client AVX-512 cores: Ice / Tiger / Rocket Lake have
# one 512-bit FMA, counted as two; Neoverse N1 has two NEON FMA pipes, counted as four; Zen 5
# mobile parts' 256-bit datapath, counted as 512): MFU then reads low, never above 100%.
CPU_SIMD_RULES: tuple[SimdRule, ...] = (
    SimdRule("AVX-512, one FMA unit (Xeon Skylake / Cascade Lake Bronze, Silver, Gold 51xx / 52xx "
             "but 5122 / 5222)", 512, 1, frozenset({"avx512f"}), _INTEL,
             name=r"\b(Bronze|Silver) [34][12]\d\d|\bGold 5[12](?!22)\d\d"),
    SimdRule("AVX-512, two FMA units (Xeon Gold 6 / Platinum, Ice Lake-SP, Sapphire Rapids and later)",
             512, 2, frozenset({"avx512f"}), _INTEL),
    SimdRule("AVX-512, two 512-bit FMA pipes (AMD Zen 5)", 512, 2, frozenset({"avx512f"}), _AMD, (26,)),
    SimdRule("AVX-512 as two 256-bit halves, two 256-bit FMA pipes (AMD Zen 4)", 256, 2,
             frozenset({"avx512f"}), _AMD, (25,)),
    SimdRule("AVX2 as two 128-bit halves, two 128-bit FMA pipes (AMD Zen / Zen+, Hygon Dhyana)", 128, 2,
             frozenset({"avx2"}), _AMD, (23, 24), below_model=0x30),
    SimdRule("AVX2, two 256-bit FMA units (Intel Haswell and later, AMD Zen 2 / 3)", 256, 2,
             frozenset({"avx2", "fma"})),
    SimdRule("AVX without FMA, one 256-bit multiply and one add per cycle (Sandy / Ivy Bridge)", 256, 1,
             frozenset({"avx"})),
    SimdRule("SSE2, one 128-bit multiply and one add per cycle", 128, 1, frozenset({"sse2"})),
    SimdRule("NEON, four 128-bit FMA pipes (Arm Neoverse V1 / V2)", 128, 4, frozenset({"asimd"})),
)
AMX_FLOPS_PER_CYCLE = 1024
"""bf16 / fp16 FLOPs per cycle of one core's AMX unit: ``TDPBF16PS`` on full tiles is a 16x32 by
32x16 multiply (8192 multiply-adds) every 16 cycles (Intel's optimization manual; Sapphire Rapids)."""
TURBO_ALLOWANCE = 2.0
"""The nominal clock times this bounds the clock where the kernel shows no maximum (virtual
machines): single-core turbo over base reaches about 2 on current server parts (Xeon Platinum
8480+ 2.0 -> 3.8 GHz, 8592+ 1.9 -> 3.9, Xeon 6980P 2.0 -> 3.9; EPYC 9654 2.4 -> 3.7)."""
TURBO_DRIVERS = frozenset({"intel_pstate", "intel_cpufreq", "amd-pstate", "amd-pstate-epp", "cppc_cpufreq"})
"""cpufreq drivers whose ``cpuinfo_max_freq`` includes turbo (acpi-cpufreq's is the base clock
when ``cpufreq/boost`` is on)."""
SYSFS_CPU = Path("/sys/devices/system/cpu")


def cpu_flops_per_cycle(cpu: CpuInfo, dtype: torch.dtype = torch.float32) -> tuple[float, str] | None:
    """Peak ``dtype`` FLOPs per cycle of one core of ``cpu`` and the units that give it; None for
    flags :data:`CPU_SIMD_RULES` does not know or a dtype without a figure."""
    rule = next((r for r in CPU_SIMD_RULES if r.matches(cpu)), None)
    if rule is None:
        return None
    fp32 = rule.vector_bits / 32 * 2 * rule.fma_units
    flags = cpu.flags
    if dtype == torch.float32:
        return fp32, rule.label
    if dtype == torch.float64:
        return fp32 / 2, rule.label
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    name = "bf16" if dtype == torch.bfloat16 else "fp16"
    if f"amx_{name}" in flags:
        return AMX_FLOPS_PER_CYCLE, f"AMX tiles, amx_{name}"
    if dtype == torch.bfloat16 and "bf16" in flags:  # Arm: BFMMLA, 16 multiply-adds per 128 bits
        return 4 * fp32, "Arm BFMMLA, 4x the fp32 rate of " + rule.label
    native = "asimdhp" if "asimdhp" in flags and dtype == torch.float16 else f"avx512_{name}"
    if native in flags:
        return 2 * fp32, f"{native}, 2x the fp32 rate of {rule.label}"
    return fp32, f"{name} widened to fp32 on {rule.label}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def cpu_clock_hz(cpu: CpuInfo, sysfs: Path = SYSFS_CPU) -> tuple[float, str] | None:
    """The highest clock of ``cpu``'s cores in Hz and where it came from (see the module
    docstring); None when neither cpufreq nor ``/proc/cpuinfo`` gives one."""
    maxima = [int(v) for v in (_read(p) for p in sysfs.glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"))
              if v and v.isdigit() and int(v) > 0]
    if maxima:
        driver = next((d for d in (_read(p) for p in sysfs.glob("cpu[0-9]*/cpufreq/scaling_driver")) if d), "")
        top = max(maxima) * 1e3  # kHz
        if driver in TURBO_DRIVERS or _read(sysfs / "cpufreq" / "boost") != "1":
            return top, f"cpufreq cpuinfo_max_freq ({driver or 'driver unknown'})"
        nominal, source = top, f"cpufreq cpuinfo_max_freq without boost ({driver})"
    elif match := re.search(r"@\s*(\d+(?:\.\d+)?)\s*GHz", cpu.model_name, flags=re.IGNORECASE):
        nominal, source = float(match.group(1)) * 1e9, "the model name"
    elif cpu.mhz:
        nominal, source = cpu.mhz * 1e6, "cpu MHz"
    else:
        return None
    return nominal * TURBO_ALLOWANCE, f"{nominal / 1e9:.2f} GHz nominal ({source}) x {TURBO_ALLOWANCE:g} for turbo"


def cpu_cores_in_use(cpu: CpuInfo, threads: int | None = None, cpus: set[int] | None = None) -> int:
    """Physical cores ``threads`` torch threads can use: ``threads`` (default
    ``torch.get_num_threads()``) capped by the distinct cores among ``cpus`` (default: this
    process's affinity), logical CPUs of unknown core counted one each."""
    threads = torch.get_num_threads() if threads is None else threads
    if cpus is None:
        cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = {cpu.core_of.get(c, ("cpu", str(c))) for c in cpus}
    return max(1, min(threads, len(cores)))


@dataclass(frozen=True)
class CpuPeak:
    """A CPU's peak FLOP/s for one dtype, and the figures it is the product of."""

    flops: float
    dtype: str
    flops_per_cycle: float  # one core
    units: str
    cores: int
    clock_hz: float
    clock_source: str

    def describe(self) -> str:
        return (f"{self.flops / 1e9:.1f} GFLOP/s {self.dtype} = {self.flops_per_cycle:g} FLOPs/cycle "
                f"({self.units}) x {self.cores} core(s) x {self.clock_hz / 1e9:.2f} GHz ({self.clock_source})")


def cpu_peak(dtype: torch.dtype = torch.float32, *, threads: int | None = None, cpus: set[int] | None = None,
             cpuinfo: str | None = None, sysfs: Path = SYSFS_CPU) -> CpuPeak | None:
    """This CPU's peak ``dtype`` FLOP/s for ``threads`` torch threads, from what the processor is
    (``cpuinfo``: the text of ``/proc/cpuinfo``, read when None); None when unknown (see the module
    docstring). No timing: the figure does not move with the machine's load."""
    if cpuinfo is None:
        cpuinfo = _read(Path("/proc/cpuinfo")) or ""
    cpu = parse_cpuinfo(cpuinfo)
    per_cycle, clock = cpu_flops_per_cycle(cpu, dtype), cpu_clock_hz(cpu, sysfs)
    if per_cycle is None or clock is None:
        return None
    cores = cpu_cores_in_use(cpu, threads, cpus)
    return CpuPeak(per_cycle[0] * cores * clock[0], _dtype_name(dtype), per_cycle[0], per_cycle[1], cores,
                   clock[0], clock[1])


def cpu_peak_flops(dtype: torch.dtype = torch.float32, *, cpuinfo: str | None = None,
                   sysfs: Path = SYSFS_CPU) -> float | None:
    """:func:`cpu_peak`'s FLOP/s at the current thread count, or None (with a warning) when unknown."""
    peak = cpu_peak(dtype, cpuinfo=cpuinfo, sysfs=sysfs)
    if peak is None:
        name = parse_cpuinfo(cpuinfo).model_name if cpuinfo is not None else cpu_model()
        warnings.warn(f"this CPU's peak {_dtype_name(dtype)} FLOP/s is unknown ({name!r}: /proc/cpuinfo and "
                      "cpufreq give no clock, or sampan.utils.hardware.CPU_SIMD_RULES knows none of its SIMD "
                      "flags), so MFU is not reported; pass TrainingArguments(peak_flops=...) with the peak "
                      "FLOP/s of the cores one process uses to get it", RuntimeWarning, stacklevel=2)
        return None
    return peak.flops


def cpu_model() -> str:
    """This machine's CPU model name (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    name = parse_cpuinfo(_read(Path("/proc/cpuinfo")) or "").model_name
    return name or platform.processor() or platform.machine() or "unknown cpu"


# --- measured GEMM rates: a second figure, never MFU's denominator ---------------------------------
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


GEMM_SIZES = (256, 512, 1024, 2048, 4096)


def gemm_rates(dtype: torch.dtype = torch.float32, sizes: tuple[int, ...] = GEMM_SIZES, repeats: int = 5,
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


def process_memory_mb() -> float:
    """Resident memory of this process in MiB (Linux ``/proc``; 0.0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0

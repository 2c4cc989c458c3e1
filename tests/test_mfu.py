"""MFU = model FLOPs per second over a peak that moves neither with the run nor with the load.

GPUs: the datasheet dense peak looked up by device name (None for unknown devices: no MFU).
CPUs: the processor's figure, FLOPs per cycle x cores x clock, read from ``/proc/cpuinfo`` and
cpufreq, never timed; checked here on canned ``/proc/cpuinfo`` texts (an AVX-512 Xeon, AVX2 and
AVX-512 EPYCs, one without a clock) and against GEMM rates measured on this machine, which it must
bound. MFU is never clamped: a figure over 100% means the FLOP count (or the peak) is wrong, and is
shown. No GPU is needed here: the GPU path is tested through the device name. Cost: about 10 s on
2 cores (two 3-step and one 1-step tiny training runs, a few small GEMMs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from sampan.io import TokenWindowDataset
from sampan.models import create
from sampan.trainer import Trainer, TrainingArguments
from sampan.utils import hardware

SEQ, VOCAB = 32, 97


def _train(tmp_path, **overrides) -> tuple[list[dict], int]:
    torch.manual_seed(0)
    model = create("gpt-tiny", vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2,
                   max_position_embeddings=SEQ)
    data = TokenWindowDataset(np.random.default_rng(0).integers(0, VOCAB, 2000), seq_len=SEQ)
    args = TrainingArguments(**{**dict(
        output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3,
        logging_steps=1, save_steps=0, tensorboard=False, progress_bar=False, seed=0), **overrides})
    Trainer(model, args, data).train()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"], model.config.flops_per_token(SEQ)


def _peaks(records: list[dict], flops_per_token: int) -> list[float]:
    """The peak each logged MFU was divided by, recovered from tokens/s."""
    return [flops_per_token * r["tokens_per_sec"] / r["mfu"] for r in records]


def test_cpu_mfu_divides_by_the_processor_peak(tmp_path):
    """With no ``peak_flops`` the CPU run's MFU divides by the processor's figure for its thread
    count, the same for every window, and stays at or under 100%."""
    records, flops_per_token = _train(tmp_path, peak_flops=None)
    want = hardware.cpu_peak(torch.float32)
    assert want is not None, "this machine's /proc/cpuinfo gives a clock and known SIMD flags"
    assert len(records) == 3 and all(0 < r["mfu"] <= 1 for r in records), [r.get("mfu") for r in records]
    assert _peaks(records, flops_per_token) == pytest.approx([want.flops] * 3, rel=1e-6)


def test_mfu_is_not_clamped_when_training_outruns_the_peak(tmp_path):
    """A peak far too low (here: given as 1 kFLOP/s) stays the peak: MFU comes out above 100% and is
    shown, with a warning that names where the peak came from, not hidden."""
    with pytest.warns(RuntimeWarning, match=r"above 100%.*TrainingArguments\.peak_flops"):
        records, flops_per_token = _train(tmp_path, peak_flops=1e3)
    mfus = [r["mfu"] for r in records]
    assert len(mfus) == 3 and all(m > 1.0 for m in mfus), mfus
    assert _peaks(records, flops_per_token) == pytest.approx([1e3] * 3, rel=1e-6)  # one peak for the run


def test_no_mfu_when_the_peak_is_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "device_peak_flops", lambda device, dtype: None)
    records, _ = _train(tmp_path, peak_flops=None, max_steps=1)
    assert "mfu" not in records[0]


@pytest.mark.parametrize(("name", "dtype", "tflops"), [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989),
    ("NVIDIA H100 80GB HBM3", torch.float16, 989),
    ("NVIDIA H100 80GB HBM3", torch.float32, 67),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756),
    ("NVIDIA H100 NVL", torch.bfloat16, 835),
    ("NVIDIA H200", torch.bfloat16, 989),
    ("NVIDIA H200 NVL", torch.bfloat16, 835),
    ("NVIDIA GH200 480GB", torch.bfloat16, 989),
    ("NVIDIA H800", torch.bfloat16, 989),
    ("NVIDIA H20", torch.bfloat16, 148),
    ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312),
    ("NVIDIA A100 80GB PCIe", torch.bfloat16, 312),
    ("NVIDIA A100-SXM4-40GB", torch.float32, 19.5),
    ("NVIDIA A800-SXM4-80GB", torch.bfloat16, 312),
    ("NVIDIA A10", torch.bfloat16, 125),
    ("NVIDIA L4", torch.bfloat16, 121),
    ("NVIDIA L40S", torch.bfloat16, 362),
    ("NVIDIA L40", torch.bfloat16, 181),
    ("NVIDIA B200", torch.bfloat16, 2250),
    ("AMD Instinct MI300X", torch.bfloat16, 1307.4),
])
def test_datasheet_peak_by_device_name(name, dtype, tflops):
    assert hardware.datasheet_peak_flops(name, dtype) == pytest.approx(tflops * 1e12)


def test_datasheet_peak_unknown_devices_and_dtypes_are_none():
    for name in ("NVIDIA GeForce GTX 1080", "Some Future Accelerator", "", "NVIDIA A10G"):
        assert hardware.datasheet_peak_flops(name, torch.bfloat16) is None, name
    assert hardware.datasheet_peak_flops("Tesla V100-SXM2-32GB", torch.bfloat16) is None  # no bf16 units
    assert hardware.datasheet_peak_flops("Tesla V100-SXM2-32GB", torch.float16) == pytest.approx(125e12)
    assert hardware.datasheet_peak_flops("NVIDIA H100 80GB HBM3", torch.int8) is None
    # fp32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32) have their own peak.
    assert hardware.datasheet_peak_flops("NVIDIA A100-SXM4-80GB", torch.float32, tf32=True) == pytest.approx(156e12)


def test_gpu_peak_comes_from_the_device_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert hardware.device_peak_flops(torch.device("cuda", 0), torch.bfloat16) == pytest.approx(989e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Mystery GPU 9000")
    with pytest.warns(RuntimeWarning, match="Mystery GPU 9000.*MFU is not reported"):
        assert hardware.device_peak_flops(torch.device("cuda", 0), torch.bfloat16) is None
    assert hardware.device_peak_flops(torch.device("meta"), torch.float32) is None




# --- the CPU's peak from canned /proc/cpuinfo texts ----------------------------------------------
def _cpuinfo(block: str, cores: int, threads_per_core: int = 1) -> str:
    """``/proc/cpuinfo`` of one socket: ``block`` once per logical CPU, hyper-threads of a core
    numbered after all the cores, as Linux numbers them."""
    return "\n\n".join(block.format(cpu=t * cores + c, core=c) for t in range(threads_per_core)
                       for c in range(cores)) + "\n"


ICE_LAKE_XEON = _cpuinfo("""processor\t: {cpu}
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 106
model name\t: Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz
stepping\t: 6
cpu MHz\t\t: 2294.608
physical id\t: 0
siblings\t: 4
core id\t\t: {core}
cpu cores\t: 2
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss \
ht syscall nx pdpe1gb rdtscp lm constant_tsc pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt \
aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch fsgsbase bmi1 avx2 smep bmi2 erms invpcid avx512f \
avx512dq rdseed adx smap avx512ifma clflushopt clwb avx512cd sha_ni avx512bw avx512vl xsaveopt xsavec xgetbv1 \
xsaves wbnoinvd arat avx512vbmi pku ospke avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg \
avx512_vpopcntdq rdpid md_clear flush_l1d arch_capabilities
bogomips\t: 4589.21""", cores=2, threads_per_core=2)

EPYC_MILAN = _cpuinfo("""processor\t: {cpu}
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC 7763 64-Core Processor
stepping\t: 1
cpu MHz\t\t: 2445.406
physical id\t: 0
siblings\t: 2
core id\t\t: {core}
cpu cores\t: 2
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht \
syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl cpuid extd_apicid pni pclmulqdq ssse3 fma \
cx16 sse4_1 sse4_2 movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy abm sse4a \
misalignsse 3dnowprefetch osvw topoext invpcid_single fsgsbase bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap \
clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero xsaveerptr rdpru arat npt nrip_save umip vaes \
vpclmulqdq rdpid fsrm
bogomips\t: 4890.81""", cores=2)

EPYC_GENOA = _cpuinfo("""processor\t: {cpu}
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC 9654 96-Core Processor
cpu MHz\t\t: 2400.000
physical id\t: 0
core id\t\t: {core}
flags\t\t: fpu sse sse2 ssse3 fma avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 \
avx512_vnni avx512vbmi avx512_vbmi2 avx512_bitalg avx512_vpopcntdq""", cores=4)

SAPPHIRE_RAPIDS = _cpuinfo("""processor\t: {cpu}
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
cpu MHz\t\t: 2000.000
physical id\t: 0
core id\t\t: {core}
flags\t\t: fpu sse sse2 ssse3 fma avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 \
avx512_vnni avx512_fp16 amx_bf16 amx_tile amx_int8""", cores=2)

NEOVERSE_N1 = _cpuinfo("""processor\t: {cpu}
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1""", cores=2)


def _xeon(model_name: str) -> str:
    return ICE_LAKE_XEON.replace("Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz", model_name)


def _sysfs(root: Path, max_khz: int, driver: str, boost: str | None = None) -> Path:
    """A cpufreq tree as the kernel lays it out under /sys/devices/system/cpu (two CPUs)."""
    for cpu in (0, 1):
        folder = root / f"cpu{cpu}" / "cpufreq"
        folder.mkdir(parents=True)
        (folder / "cpuinfo_max_freq").write_text(f"{max_khz}\n")
        (folder / "scaling_driver").write_text(f"{driver}\n")
    if boost is not None:
        (root / "cpufreq").mkdir()
        (root / "cpufreq" / "boost").write_text(f"{boost}\n")
    return root


@pytest.mark.parametrize(("text", "dtype", "per_cycle"), [
    (ICE_LAKE_XEON, torch.float32, 64),  # 512-bit: 16 lanes x 2 FLOPs x 2 FMA units
    (ICE_LAKE_XEON, torch.bfloat16, 64),  # no avx512_bf16: bf16 is widened to fp32
    (ICE_LAKE_XEON, torch.float16, 64),
    (ICE_LAKE_XEON, torch.float64, 32),
    (_xeon("Intel(R) Xeon(R) Silver 4114 CPU @ 2.20GHz"), torch.float32, 32),  # one FMA unit
    (_xeon("Intel(R) Xeon(R) Gold 5118 CPU @ 2.30GHz"), torch.float32, 32),
    (_xeon("Intel(R) Xeon(R) Gold 5122 CPU @ 3.60GHz"), torch.float32, 64),  # the Gold 5 with two
    (_xeon("Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz"), torch.float32, 64),
    (_xeon("Intel(R) Xeon(R) Gold 5318Y CPU @ 2.10GHz"), torch.float32, 64),  # Ice Lake: two
    (EPYC_MILAN, torch.float32, 32),  # 256-bit x 2 FMA pipes
    (EPYC_MILAN, torch.bfloat16, 32),
    (EPYC_GENOA, torch.float32, 32),  # Zen 4: AVX-512 as two 256-bit halves
    (EPYC_GENOA, torch.bfloat16, 64),  # avx512_bf16: twice fp32
    (SAPPHIRE_RAPIDS, torch.float32, 64),
    (SAPPHIRE_RAPIDS, torch.bfloat16, 1024),  # AMX tiles
    (SAPPHIRE_RAPIDS, torch.float16, 128),  # avx512_fp16 (no amx_fp16 before Granite Rapids)
    (NEOVERSE_N1, torch.float32, 32),
    (NEOVERSE_N1, torch.float16, 64),  # asimdhp
])
def test_flops_per_cycle_from_flags_and_model(text, dtype, per_cycle):
    per_core = hardware.cpu_flops_per_cycle(hardware.parse_cpuinfo(text), dtype)
    assert per_core is not None and per_core[0] == per_cycle, per_core


def test_parse_cpuinfo_reads_model_flags_clock_and_cores():
    cpu = hardware.parse_cpuinfo(ICE_LAKE_XEON)
    assert cpu.model_name == "Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz"
    assert (cpu.vendor, cpu.family, cpu.model, cpu.mhz) == ("GenuineIntel", 6, 106, 2294.608)
    assert {"avx512f", "fma", "avx2"} <= cpu.flags and "avx512_bf16" not in cpu.flags
    assert cpu.core_of == {0: ("0", "0"), 1: ("0", "1"), 2: ("0", "0"), 3: ("0", "1")}  # 2 cores, 2 threads each
    arm = hardware.parse_cpuinfo(NEOVERSE_N1)
    assert arm.mhz is None and arm.vendor == "" and "asimd" in arm.flags and arm.core_of == {}
    assert hardware.cpu_flops_per_cycle(hardware.parse_cpuinfo("flags : mmx"), torch.float32) is None
    assert hardware.cpu_flops_per_cycle(arm, torch.int8) is None


def test_avx512_xeon_peak_from_the_model_names_clock(tmp_path):
    """No cpufreq (a VM): the model name's nominal 2.30 GHz x the turbo allowance. Hyper-threads
    share their core's FMA units, so 4 threads on 2 cores count 2 cores."""
    cpus = {0, 1, 2, 3}
    peak = hardware.cpu_peak(torch.float32, threads=4, cpus=cpus, cpuinfo=ICE_LAKE_XEON, sysfs=tmp_path)
    assert peak.cores == 2 and peak.clock_hz == pytest.approx(2.3e9 * hardware.TURBO_ALLOWANCE)
    assert peak.flops == pytest.approx(64 * 2 * 2.3e9 * hardware.TURBO_ALLOWANCE)
    assert "model name" in peak.clock_source and "2.30 GHz" in peak.describe()
    one = hardware.cpu_peak(torch.float32, threads=1, cpus=cpus, cpuinfo=ICE_LAKE_XEON, sysfs=tmp_path)
    assert one.cores == 1 and one.flops == pytest.approx(peak.flops / 2)
    # Only the CPUs this process may run on count: CPUs 0 and 2 are the two threads of core 0.
    assert hardware.cpu_peak(torch.float32, threads=4, cpus={0, 2}, cpuinfo=ICE_LAKE_XEON, sysfs=tmp_path).cores == 1
    # A driver that reports turbo in cpuinfo_max_freq (intel_pstate): that maximum, as it is.
    sysfs = _sysfs(tmp_path / "sys", 3_400_000, "intel_pstate")
    turbo = hardware.cpu_peak(torch.float32, threads=4, cpus=cpus, cpuinfo=ICE_LAKE_XEON, sysfs=sysfs)
    assert turbo.clock_hz == pytest.approx(3.4e9) and turbo.flops == pytest.approx(64 * 2 * 3.4e9)


def test_avx2_epyc_peak_from_cpu_mhz_and_acpi_cpufreq(tmp_path):
    """AMD's model names carry no clock: ``cpu MHz`` is the nominal one. acpi-cpufreq's maximum is
    the base clock while boost is on (allowance applied), the real maximum when boost is off."""
    cpus = {0, 1}
    peak = hardware.cpu_peak(torch.bfloat16, threads=8, cpus=cpus, cpuinfo=EPYC_MILAN, sysfs=tmp_path)
    assert peak.cores == 2 and peak.flops == pytest.approx(32 * 2 * 2445.406e6 * hardware.TURBO_ALLOWANCE)
    assert "cpu MHz" in peak.clock_source and "widened to fp32" in peak.units
    boosted = _sysfs(tmp_path / "boost", 2_450_000, "acpi-cpufreq", boost="1")
    assert hardware.cpu_clock_hz(hardware.parse_cpuinfo(EPYC_MILAN), boosted)[0] == pytest.approx(
        2.45e9 * hardware.TURBO_ALLOWANCE)
    fixed = _sysfs(tmp_path / "fixed", 2_450_000, "acpi-cpufreq", boost="0")
    assert hardware.cpu_clock_hz(hardware.parse_cpuinfo(EPYC_MILAN), fixed)[0] == pytest.approx(2.45e9)


def test_no_clock_no_peak_and_no_mfu(tmp_path):
    """ARM's /proc/cpuinfo has no clock: without cpufreq there is no peak (a warning says how to
    give one), never a timed figure in its place; with cpufreq's maximum there is one."""
    assert hardware.cpu_peak(torch.float32, threads=2, cpus={0, 1}, cpuinfo=NEOVERSE_N1, sysfs=tmp_path) is None
    with pytest.warns(RuntimeWarning, match=r"unknown.*MFU is not reported.*peak_flops"):
        assert hardware.cpu_peak_flops(torch.float32, cpuinfo=NEOVERSE_N1, sysfs=tmp_path) is None
    sysfs = _sysfs(tmp_path / "sys", 3_000_000, "cppc_cpufreq")
    peak = hardware.cpu_peak(torch.float32, threads=2, cpus={0, 1}, cpuinfo=NEOVERSE_N1, sysfs=sysfs)
    assert peak.flops == pytest.approx(32 * 2 * 3e9)


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="the CPU peak is read from Linux's /proc/cpuinfo")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_this_machines_peak_bounds_its_measured_gemm_rates(dtype):
    """The processor's figure is an upper bound: torch's GEMM, timed now at 1 and at all threads,
    never beats it (other work on the machine only slows the GEMM, so load cannot fail this)."""
    threads = torch.get_num_threads()
    cores = hardware.cpu_cores_in_use(hardware.parse_cpuinfo(Path("/proc/cpuinfo").read_text()), threads=1 << 20)
    try:
        for count in sorted({1, threads}):
            torch.set_num_threads(count)
            peak = hardware.cpu_peak(dtype)
            assert peak is not None and peak.cores == min(count, cores)
            rates = hardware.gemm_rates(dtype, sizes=(256, 512), repeats=3, min_seconds=0.05)
            assert max(rates.values()) <= peak.flops, (count, rates, peak.describe())
            assert hardware.device_peak_flops("cpu", dtype) == peak.flops
    finally:
        torch.set_num_threads(threads)


def test_gemm_rates_are_one_best_of_n_rate_per_size():
    """A real (small) measurement: one best-of-N rate per size, and a size skipped when one matmul
    of it would take longer than the budget."""
    quick = dict(repeats=2, min_seconds=0.0)
    rates = hardware.gemm_rates(torch.float32, sizes=(128, 64), **quick)
    assert list(rates) == [64, 128] and all(rate > 1e6 for rate in rates.values())
    assert set(hardware.gemm_rates(torch.float32, sizes=(64, 8192), max_matmul_seconds=0.05, **quick)) == {64}

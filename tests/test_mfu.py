"""MFU = model FLOPs per second over a peak that does not move with the run.

GPUs: the datasheet dense peak looked up by device name (None for unknown devices: no MFU).
CPUs: a GEMM peak measured once per machine (several sizes, best of N) and cached under
``$SAMPAN_HOME/cache``. MFU is never clamped: a figure over 100% means the FLOP count (or the peak)
is wrong, and is shown. No GPU is needed here: the GPU path is tested through the device name.
"""

from __future__ import annotations

import json
import time
import types

import numpy as np
import pytest
import torch

from sampan.io import TokenWindowDataset
from sampan.models import create
from sampan.trainer import Trainer, TrainingArguments
from sampan.utils import hardware

SEQ, VOCAB = 32, 97


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private $SAMPAN_HOME, so no test reads or writes the real peak cache."""
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _slow_clock() -> types.ModuleType:
    """``time`` whose ``perf_counter`` advances 1000 s per call: every GEMM timed with it looks slow."""
    fake = types.ModuleType("time")
    fake.__dict__.update(time.__dict__)
    ticks = iter(range(0, 10**9, 1000))
    fake.perf_counter = lambda: float(next(ticks))
    return fake


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


def test_mfu_is_not_clamped_when_training_outruns_the_measured_peak(tmp_path, home, monkeypatch):
    """The start-up GEMM came out far too slow (here: a clock that makes it look so). The peak
    stays what was measured, and MFU comes out above 100% -- shown, with a warning, not hidden."""
    monkeypatch.setattr(hardware, "time", _slow_clock())
    monkeypatch.setattr(hardware, "_MEASURED_UNDER_LOAD", {})  # no peak an earlier test measured
    with pytest.warns(RuntimeWarning, match="above 100%"):
        records, flops_per_token = _train(tmp_path, peak_flops=None)
    cache = hardware.cpu_peak_cache_path()  # under this test's SAMPAN_HOME, before undo() restores it
    monkeypatch.undo()
    mfus = [r["mfu"] for r in records]
    assert len(mfus) == 3 and all(m > 1.0 for m in mfus), mfus
    peaks = [flops_per_token * r["tokens_per_sec"] / r["mfu"] for r in records]
    assert max(peaks) == pytest.approx(min(peaks), rel=1e-9)  # one peak for the whole run
    assert peaks[0] < 1e6  # the (slow-clock) measurement, not the rate training reached
    # The peak training outran is not kept for the next run.
    assert not cache.exists() or hardware.cpu_peak_key(torch.float32) not in json.loads(cache.read_text())["peaks"]


def test_no_mfu_when_the_peak_is_unknown(tmp_path, home, monkeypatch):
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


def test_cpu_peak_is_measured_once_and_cached(home, monkeypatch):
    calls = []

    def fake_measure(dtype, **kwargs):
        calls.append((dtype, torch.get_num_threads()))
        return 1e9 * len(calls)

    monkeypatch.setattr(hardware, "measure_cpu_peak_flops", fake_measure)
    monkeypatch.setattr(hardware, "_busy", lambda: False)  # a quiet machine: measurements are kept
    monkeypatch.setattr(hardware, "_MEASURED_UNDER_LOAD", {})
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = hardware.cpu_peak_flops(torch.float32)
        assert first == 1e9 and len(calls) == 1
        path = hardware.cpu_peak_cache_path()
        assert path.is_relative_to(home) and path.is_file()
        assert [p.name for p in path.parent.iterdir()] == [path.name]  # written atomically: no temporary left
        assert hardware.cpu_peak_flops(torch.float32) == first and len(calls) == 1  # read back, not re-measured
        assert hardware.device_peak_flops(torch.device("cpu"), torch.float32) == first and len(calls) == 1
        # Another dtype or another thread count is another peak: measured, and cached beside the first.
        assert hardware.cpu_peak_flops(torch.bfloat16) == 2e9 and len(calls) == 2
        torch.set_num_threads(2)
        assert hardware.cpu_peak_flops(torch.float32) == 3e9 and calls[-1] == (torch.float32, 2)
        torch.set_num_threads(1)
        assert hardware.cpu_peak_flops(torch.float32) == first and len(calls) == 3
        assert len(json.loads(path.read_text())["peaks"]) == 3
        # remeasure=True measures again and replaces the entry; a damaged file is measured over.
        assert hardware.cpu_peak_flops(torch.float32, remeasure=True) == 4e9
        path.write_text("{not json")
        assert hardware.cpu_peak_flops(torch.float32) == 5e9 and len(calls) == 5
        assert hardware.cpu_peak_flops(torch.float32) == 5e9 and len(calls) == 5
    finally:
        torch.set_num_threads(threads)


def test_a_peak_measured_on_a_busy_machine_is_not_cached_and_an_outrun_one_is_dropped(home, monkeypatch):
    """A GEMM timed while other work holds the cores comes out low; cached, it would show every
    later run above 100% MFU. So it serves its own run only, and a cached peak that training
    outruns is dropped, so the next run measures again."""
    calls = []
    monkeypatch.setattr(hardware, "measure_cpu_peak_flops", lambda dtype, **kw: calls.append(dtype) or 1e9)
    monkeypatch.setattr(hardware, "_busy", lambda: True)
    monkeypatch.setattr(hardware, "_MEASURED_UNDER_LOAD", {})
    assert hardware.cpu_peak_flops(torch.float32) == 1e9
    assert not hardware.cpu_peak_cache_path().exists()
    assert hardware.cpu_peak_flops(torch.float32) == 1e9 and len(calls) == 1  # kept for this process
    hardware.forget_cpu_peak(torch.float32)
    assert hardware.cpu_peak_flops(torch.float32) == 1e9 and len(calls) == 2  # measured again
    hardware.forget_cpu_peak(torch.float32)
    monkeypatch.setattr(hardware, "_busy", lambda: False)
    hardware.cpu_peak_flops(torch.float32)
    key = hardware.cpu_peak_key(torch.float32)
    assert key in json.loads(hardware.cpu_peak_cache_path().read_text())["peaks"]
    hardware.forget_cpu_peak(torch.float32)
    assert key not in json.loads(hardware.cpu_peak_cache_path().read_text())["peaks"]


def test_cpu_peak_key_names_cpu_torch_threads_and_dtype():
    key = hardware.cpu_peak_key(torch.float32, threads=1)
    assert torch.__version__ in key and "float32" in key and hardware.cpu_model() in key
    assert key != hardware.cpu_peak_key(torch.float32, threads=2)
    assert key != hardware.cpu_peak_key(torch.bfloat16, threads=1)
    assert key == hardware.cpu_peak_key(torch.float32, threads=1)


def test_cpu_measurement_is_the_best_gemm_rate_over_sizes():
    """A real (small) measurement: one best-of-N rate per size, the peak their maximum, and a size
    skipped when one matmul of it would take longer than the budget."""
    quick = dict(repeats=2, min_seconds=0.0)
    rates = hardware.gemm_rates(torch.float32, sizes=(128, 64), **quick)
    assert list(rates) == [64, 128] and all(rate > 1e6 for rate in rates.values())
    assert hardware.measure_cpu_peak_flops(torch.float32, sizes=(64, 128), **quick) > 1e6
    assert set(hardware.gemm_rates(torch.float32, sizes=(64, 8192), max_matmul_seconds=0.05, **quick)) == {64}

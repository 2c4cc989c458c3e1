"""The device choice on every training entry point, on a CPU-only machine: spelling, resolution,
the one-line error for a missing GPU, amp="auto", and ``compile`` in the Trainer."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from sampan import amp as amp_module
from sampan.amp import resolve_amp
from sampan.io import TokenWindowDataset
from sampan.models import create
from sampan.nn.compile import apply_compile, is_compiled
from sampan.trainer import Trainer, TrainingArguments
from sampan.utils.device import DeviceError, check_device_spec, device_of, resolve_device

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize(("spec", "normal"), [
    ("auto", "auto"), ("cpu", "cpu"), ("CUDA", "cuda"), ("cuda:3", "cuda:3"), ("gpu", "cuda"), ("gpu:1", "cuda:1"),
    (" cpu ", "cpu"), (torch.device("cuda", 2), "cuda:2"),
])
def test_device_specs_normalise_without_looking_at_hardware(spec, normal):
    assert check_device_spec(spec) == normal


@pytest.mark.parametrize("spec", ["tpu", "cpu:0", "auto:1", "cuda:", "cuda:-1", "", "mps"])
def test_a_misspelt_device_names_the_choices(spec):
    with pytest.raises(DeviceError, match=r"is not one of auto, cpu, cuda or cuda:N"):
        check_device_spec(spec)
    with pytest.raises(DeviceError, match="must be a string"):
        check_device_spec(0)


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-only behaviour")
def test_auto_is_the_cpu_and_cuda_is_one_clear_error_without_a_gpu(monkeypatch):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "3")  # under torchrun: still the CPU when there is no GPU
    assert resolve_device("auto") == torch.device("cpu")
    for spec in ("cuda", "cuda:0", "gpu:1"):
        with pytest.raises(DeviceError) as err:
            resolve_device(spec)
        message = str(err.value)
        assert "\n" not in message
        assert "sees no CUDA GPU" in message and "use device 'cpu' or 'auto'" in message
        assert torch.__version__ in message


def test_local_rank_picks_each_ranks_gpu(monkeypatch):
    """With GPUs, "auto" / "cuda" under a launcher take cuda:$LOCAL_RANK, and a rank past the
    node's GPUs is an error naming them (the count is what torch reports; here faked as 2 GPUs,
    which only changes what the resolver is told, not the code path it takes)."""
    from sampan.utils import device as device_module

    monkeypatch.setattr(device_module, "_cuda_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(DeviceError, match=r"LOCAL_RANK=2 picks GPU 2, but this machine has 2 CUDA GPUs"):
        resolve_device("auto")
    with pytest.raises(DeviceError, match=r"that is GPU 5, but this machine has 2 CUDA GPUs \(cuda:0..cuda:1\)"):
        resolve_device("cuda:5")


def test_amp_auto_is_bf16_on_gpus_with_it_and_what_is_fast_on_the_cpu(monkeypatch):
    for explicit in (None, "bf16", "fp16"):
        assert resolve_amp(explicit, "cpu") == explicit
    monkeypatch.setattr(amp_module, "_CPU_GEMM_RATES", (2.0, 1.0))
    assert resolve_amp("auto", "cpu") == "bf16"
    monkeypatch.setattr(amp_module, "_CPU_GEMM_RATES", (1.0, 2.0))
    assert resolve_amp("auto", "cpu") is None
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_amp("auto", "cuda:0") == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_amp("auto", "cuda:0") == "fp16"


def test_cpu_bf16_verdict_is_the_measured_one(monkeypatch):
    from sampan.utils.hardware import measure_gemm_flops

    monkeypatch.setattr(amp_module, "_CPU_GEMM_RATES", None)
    verdict = amp_module.cpu_bf16_is_fast()
    bf16 = measure_gemm_flops(torch.bfloat16, size=256, seconds=0.05)
    fp32 = measure_gemm_flops(torch.float32, size=256, seconds=0.05)
    if max(bf16, fp32) > 1.5 * min(bf16, fp32):  # a clear winner: the verdict must name it
        assert verdict == (bf16 > fp32)


def test_training_arguments_take_a_device_and_reject_a_bad_one():
    assert TrainingArguments().device == "auto"
    assert TrainingArguments(device="GPU:0").device == "cuda:0"
    assert TrainingArguments(amp="auto").amp == "auto"
    with pytest.raises(DeviceError, match="'npu' is not one of"):
        TrainingArguments(device="npu")
    with pytest.raises(ValueError, match="TrainingArguments.compile must be bool"):
        TrainingArguments(compile="yes")


def _tiny_run(tmp_path, **kwargs):
    torch.manual_seed(0)
    model = create("gpt-tiny", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=16)
    tokens = np.random.default_rng(0).integers(0, 64, size=1200)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, logging_steps=1,
                             save_steps=0, learning_rate=1e-2, peak_flops=0, tensorboard=False, progress_bar=False,
                             **kwargs)
    return model, Trainer(model, args, TokenWindowDataset(tokens, seq_len=16))


def test_trainer_places_the_model_and_resolves_amp(tmp_path):
    model, trainer = _tiny_run(tmp_path, device="cpu", amp="auto")
    assert trainer.device == torch.device("cpu") and device_of(trainer.model) == torch.device("cpu")
    assert trainer.args.amp in (None, "bf16")  # "auto" is resolved once, for the device
    assert trainer.args.amp == resolve_amp("auto", "cpu")
    # the optimizer was built on the placed parameters
    params = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert params == {id(p) for p in model.parameters()}


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-only behaviour")
def test_trainer_on_a_missing_gpu_fails_before_training(tmp_path):
    with pytest.raises(DeviceError, match="sees no CUDA GPU"):
        _tiny_run(tmp_path / "run", device="cuda")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-only behaviour")
@pytest.mark.parametrize("argv", [
    ["pretrain", "--data", "nowhere", "--device", "cuda"],
    ["finetune", "--task", "sentiment_analysis", "--model", "ernie-tiny", "--output-dir", "x", "--device", "cuda:1"],
    ["demo", "--gpt.training.device", "cuda"],
    ["bench", "comm", "--device", "cuda"],
])
def test_cli_verbs_take_a_device_and_say_when_there_is_no_gpu(argv, tmp_path):
    run = subprocess.run([sys.executable, "-m", "sampan.cli", *argv], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "error: device" in lines[0] and "sees no CUDA GPU" in lines[0], run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.skipif(not NO_CUDA, reason="checks the CPU-only behaviour")
def test_train_device_flag_overrides_the_run_file(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('[model]\nname = "gpt-tiny"\n[data]\ncorpus = "sanguo"\nseq_len = 16\n'
                        f'[training]\noutput_dir = "{tmp_path / "out"}"\nmax_steps = 1\ndevice = "cpu"\n')
    run = subprocess.run([sys.executable, "-m", "sampan.cli", "train", "--config", str(run_file), "--device", "cuda"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "sees no CUDA GPU" in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("verb", ["train", "pretrain", "finetune", "demo"])
def test_help_of_each_training_verb_shows_device_and_compile(verb):
    run = subprocess.run([sys.executable, "-m", "sampan.cli", verb, "--help"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0
    assert "--device" in run.stdout
    if verb != "demo":
        assert "--compile" in run.stdout


def test_apply_compile_needs_blocks_and_is_idempotent():
    with pytest.raises(ValueError, match="found no transformer blocks"):
        apply_compile(torch.nn.Linear(2, 2))
    assert apply_compile(torch.nn.Linear(2, 2), enabled=False) == 0
    model = create("gpt-tiny", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=16)
    assert not is_compiled(model)
    assert apply_compile(model) == 2 and is_compiled(model)
    keys = sorted(model.state_dict())
    assert apply_compile(model) == 2 and sorted(model.state_dict()) == keys  # no wrapper, same keys


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compiled_training_with_recompute_matches_eager(tmp_path):
    """compile=True with full recompute logs the eager run's losses (inductor reorders float math,
    so to 1e-5, not bit for bit); the blocks really run compiled."""
    import torch._dynamo.utils as dynamo

    def losses(out, **kwargs):
        _, trainer = _tiny_run(out, device="cpu", **kwargs)
        trainer.train()
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        return trainer, [row["loss"] for row in rows if "loss" in row]

    _, eager = losses(tmp_path / "eager")
    dynamo.counters.clear()
    trainer, compiled = losses(tmp_path / "compiled", compile=True, recompute="full")
    assert is_compiled(trainer.model)
    assert dynamo.counters["stats"]["unique_graphs"] >= 1  # dynamo captured the block
    assert len(compiled) == len(eager) == 3
    assert compiled == pytest.approx(eager, rel=1e-5)


def test_a_rank_naming_another_ranks_gpu_is_refused(monkeypatch):
    """With a strategy each rank trains on cuda:$LOCAL_RANK; naming another GPU is an error before
    any process group starts (the GPU count is faked: only the resolver is told 4 GPUs)."""
    from sampan.trainer.fleet_backend import FleetBackend
    from sampan.utils import device as device_module

    monkeypatch.setattr(device_module, "_cuda_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = TrainingArguments(device="cuda:3", strategy={"hybrid_configs": {"dp_degree": 1}})
    with pytest.raises(ValueError, match=r"each rank trains on its own GPU \(cuda:\$LOCAL_RANK = cuda:0\)"):
        FleetBackend(args)

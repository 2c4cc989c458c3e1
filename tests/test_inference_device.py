"""Inference on a GPU: ``Config``'s device (Paddle's ``enable_use_gpu``), the predictor's device on
both backends, ONNX Runtime's provider choice, ``Taskflow(device=)`` and ``--device`` on the
task / serve / export verbs.

The decisions (which providers, which error) are plain functions, tested on given provider lists.
What needs the hardware is tested against what this machine has: on a CPU-only machine a GPU asked
for is the one-line ``DeviceError`` naming the fix; where torch sees a GPU (or ONNX Runtime has its
CUDA provider) the same test runs the model there and compares it with the CPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from torch import nn

from sampan.cli import main as cli_main
from sampan.inference import Config, create_predictor, export_model
from sampan.inference.backends import load_program
from sampan.inference.device import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    check_session_providers,
    no_cuda_provider_message,
    ort_providers,
    predictor_device,
)
from sampan.static import InputSpec
from sampan.utils.device import DeviceError, check_device_spec

# What this machine has, which decides what a GPU request does (module docstring).
TORCH_GPU = torch.cuda.is_available()
ORT_GPU = CUDA_PROVIDER in onnxruntime.get_available_providers()
VOCAB = 50


class PositionalLogits(nn.Module):
    """``input_ids [B, S] -> logits [B, S, 3]`` with a tensor made inside ``forward``: export bakes
    its device into the graph (``arange(..., device=cpu)``), which is what moving a program to
    another device must rewrite."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.out(self.embed(input_ids) + positions[None, :, None].float())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    model = PositionalLogits().eval()
    spec = [InputSpec([None, None], "int64", "input_ids")]
    out = export_model(model, tmp_path_factory.mktemp("device") / "tiny", spec, output_names=["logits"])
    return {"dir": out, "model": model}


def _ids(batch: int = 2, seq: int = 7) -> np.ndarray:
    return np.random.default_rng(0).integers(0, VOCAB, (batch, seq), dtype=np.int64)


# --- Config: Paddle's GPU API ------------------------------------------------------------------------


def test_config_gpu_api_round_trip(tiny, monkeypatch):
    config = Config(tiny["dir"])
    assert (config.device, config.use_gpu(), config.gpu_device_id()) == ("cpu", False, 0)
    config.enable_use_gpu(memory_pool_init_size_mb=256, device_id=1)  # the pool size is accepted, not used
    assert (config.device, config.use_gpu(), config.gpu_device_id()) == ("cuda:1", True, 1)
    config.enable_use_gpu()  # Paddle's defaults: 100 MB, GPU 0
    assert (config.device, config.gpu_device_id()) == ("cuda:0", 0)
    config.disable_gpu()
    assert (config.device, config.use_gpu(), config.gpu_device_id()) == ("cpu", False, 0)
    # Only the spelling is checked here, on any machine: a GPU config is made on a CPU-only one.
    assert Config(tiny["dir"], device="gpu:2").device == "cuda:2"  # Paddle's spelling
    assert Config(tiny["dir"], device=" CUDA ").use_gpu() is True
    auto = Config(tiny["dir"], device="auto")
    assert auto.use_gpu() is False  # "auto" asks for nothing; the predictor decides
    monkeypatch.setenv("LOCAL_RANK", "3")  # "cuda" is this process's GPU on its node
    assert Config(tiny["dir"], device="cuda").gpu_device_id() == 3


def test_config_refuses_bad_devices_and_keeps_what_it_had(tiny):
    with pytest.raises(DeviceError, match="device 'tpu' is not one of auto, cpu, cuda or cuda:N"):
        Config(tiny["dir"], device="tpu")
    config = Config(tiny["dir"])
    config.enable_use_gpu(device_id=1)
    for bad, message in ((dict(device_id=-1), "device_id must be a GPU index"),
                         (dict(device_id=True), "device_id must be a GPU index"),
                         (dict(memory_pool_init_size_mb="big"), "memory_pool_init_size_mb must be a number")):
        with pytest.raises(ValueError, match=message):
            config.enable_use_gpu(**bad)
        assert config.device == "cuda:1"  # a rejected change leaves the config as it was


def test_config_stays_backward_compatible(tiny):
    """The fields before ``device`` keep their order and defaults: positional calls still work."""
    assert [f.name for f in dataclasses.fields(Config)] == ["model_dir", "backend", "num_threads", "precision",
                                                             "fuse", "device"]
    config = Config(tiny["dir"], "torch", 2, "fp32", False)
    assert (config.backend, config.num_threads, config.precision, config.fuse, config.device) == (
        "torch", 2, "fp32", False, "cpu")


# --- the predictor on a device ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_cpu_and_auto_predictors_compute_what_they_did(tiny, backend):
    ids = _ids()
    with torch.no_grad():
        expected = tiny["model"](torch.from_numpy(ids)).numpy()
    default = create_predictor(Config(tiny["dir"], backend=backend))
    assert default.device == "cpu"
    np.testing.assert_allclose(default.run({"input_ids": ids})[0], expected, atol=1e-5)
    auto = create_predictor(Config(tiny["dir"], backend=backend, device="auto"))
    gpu_here = TORCH_GPU if backend == "torch" else ORT_GPU
    assert auto.device == ("cuda:0" if gpu_here else "cpu")
    got = auto.run({"input_ids": ids})[0]
    assert isinstance(got, np.ndarray)  # numpy on the host, whatever the device
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_a_gpu_on_torch_runs_there_or_says_there_is_none(tiny):
    config = Config(tiny["dir"], backend="torch")
    config.enable_use_gpu()
    if not TORCH_GPU:
        with pytest.raises(DeviceError) as caught:
            create_predictor(config)
        message = str(caught.value)
        assert "\n" not in message
        assert message.startswith(f"device 'cuda:0' asked for, but torch {torch.__version__} sees no CUDA GPU")
        assert "use device 'cpu' or 'auto', or install a CUDA build of torch" in message
        return
    predictor = create_predictor(config)
    assert predictor.device == "cuda:0"
    ids = _ids()
    cpu = create_predictor(Config(tiny["dir"], backend="torch")).run([ids])[0]
    np.testing.assert_allclose(predictor.run([ids])[0], cpu, atol=1e-4)


def test_a_gpu_on_onnxruntime_runs_there_or_names_onnxruntime_gpu(tiny):
    if not ORT_GPU:
        with pytest.raises(DeviceError) as caught:
            create_predictor(Config(tiny["dir"], device="cuda"))
        message = str(caught.value)
        assert "\n" not in message
        assert f"onnxruntime {onnxruntime.__version__} here has no CUDAExecutionProvider" in message
        assert "pip install onnxruntime-gpu in place of onnxruntime" in message
        assert "backend='torch'" in message and "device 'cpu'" in message
        return
    predictor = create_predictor(Config(tiny["dir"], device="cuda:0"))
    assert predictor.device == "cuda:0"


def test_moving_a_program_rewrites_the_devices_export_baked_in(tiny):
    """``load_program`` moves the program with ``move_to_device_pass``; ``.module().to()`` would not
    move the ``arange`` device constant. The meta device (no data, any machine) shows both."""
    path = tiny["dir"] / "inference.pt2"
    meta = torch.device("meta")
    stale = torch.export.load(path).module().to(meta)
    with pytest.raises(RuntimeError, match="device"):
        stale(torch.zeros(2, 7, dtype=torch.int64, device=meta))
    moved = load_program(path, meta)
    out = moved(torch.zeros(2, 7, dtype=torch.int64, device=meta))
    assert out.device == meta and tuple(out.shape) == (2, 7, 3)
    on_cpu = load_program(path, torch.device("cpu"))
    ids = torch.from_numpy(_ids())
    with torch.no_grad():
        torch.testing.assert_close(on_cpu(ids), tiny["model"](ids))


# --- ONNX Runtime's providers: the decision on given provider lists ---------------------------------


def test_ort_provider_choice(monkeypatch):
    cuda_and_cpu = [CUDA_PROVIDER, CPU_PROVIDER]
    plain = ["AzureExecutionProvider", CPU_PROVIDER]  # what the plain onnxruntime wheel lists
    assert ort_providers("cpu", cuda_and_cpu) == [CPU_PROVIDER]
    assert ort_providers("auto", plain) == [CPU_PROVIDER]
    assert ort_providers("auto", cuda_and_cpu) == [(CUDA_PROVIDER, {"device_id": 0}), CPU_PROVIDER]
    assert ort_providers("cuda:1", cuda_and_cpu) == [(CUDA_PROVIDER, {"device_id": 1}), CPU_PROVIDER]
    assert ort_providers("gpu:2", cuda_and_cpu) == [(CUDA_PROVIDER, {"device_id": 2}), CPU_PROVIDER]
    monkeypatch.setenv("LOCAL_RANK", "1")  # "cuda" under a launcher: this rank's GPU
    assert ort_providers("cuda", cuda_and_cpu) == [(CUDA_PROVIDER, {"device_id": 1}), CPU_PROVIDER]
    with pytest.raises(DeviceError) as caught:
        ort_providers("cuda", plain, "1.32.0")
    assert str(caught.value) == no_cuda_provider_message("cuda", plain, "1.32.0")
    assert str(caught.value) == (
        "device 'cuda' asked for, but onnxruntime 1.32.0 here has no CUDAExecutionProvider (its providers: "
        "AzureExecutionProvider, CPUExecutionProvider): pip install onnxruntime-gpu in place of onnxruntime "
        "(uninstall onnxruntime first; both install the same module), or run the .pt2 program on the GPU with "
        "backend='torch', or use device 'cpu'")
    with pytest.raises(DeviceError, match="is not one of auto, cpu, cuda or cuda:N"):
        ort_providers("cuda:x", cuda_and_cpu)


def test_a_cuda_provider_that_did_not_start_is_an_error_only_when_asked_for():
    """ONNX Runtime falls back to the CPU when its CUDA provider cannot start; "auto" accepts that."""
    asked = [(CUDA_PROVIDER, {"device_id": 0}), CPU_PROVIDER]
    assert check_session_providers("cuda", asked, [CUDA_PROVIDER, CPU_PROVIDER]) == "cuda:0"
    assert check_session_providers("auto", asked, [CPU_PROVIDER]) == "cpu"
    assert check_session_providers("cpu", [CPU_PROVIDER], [CPU_PROVIDER]) == "cpu"
    with pytest.raises(DeviceError, match="has its CUDAExecutionProvider but could not start it on GPU 0"):
        check_session_providers("cuda:0", asked, [CPU_PROVIDER])


def test_plain_specs_need_no_torch_import():
    """A deployed Taskflow (device "auto") on ONNX Runtime must not import torch for its device."""
    import subprocess
    import sys

    probe = ("import sys; from sampan.inference.device import ort_providers; "
             "from sampan.utils.device import check_device_spec; "
             "print(check_device_spec(' Auto '), check_device_spec('CPU'), "
             "*ort_providers('auto', ['CPUExecutionProvider']), 'torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert run.stdout.split() == ["auto", "cpu", "CPUExecutionProvider", "False"]


# --- Taskflow(device=) --------------------------------------------------------------------------------


@pytest.fixture
def sampan_home(tmp_path, monkeypatch):
    """A private $SAMPAN_HOME: only the shipped models resolve, and exports go to a fresh cache in it."""
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    return tmp_path


def test_taskflow_gpu_asked_fails_before_the_export(sampan_home):
    from sampan.taskflow import Taskflow

    for backend, gpu_here, says in (("onnxruntime", ORT_GPU, "pip install onnxruntime-gpu"),
                                    ("torch", TORCH_GPU, "sees no CUDA GPU")):
        if gpu_here:
            continue  # this machine can: the GPU run itself is test_taskflow_runs_on_the_device_asked
        with pytest.raises(DeviceError, match=says):
            Taskflow("sentiment_analysis", device="cuda", backend=backend)
    assert not (sampan_home / "cache").exists()  # refused before the (slow) export, not after
    with pytest.raises(DeviceError, match="device 'npu' is not one of"):
        Taskflow("sentiment_analysis", device="npu")
    # jieba's segmentation runs no model: a GPU asked for is no reason for it to fail
    assert Taskflow("word_segmentation", device="cuda")("我爱北京")[0]["words"] == ["我", "爱", "北京"]


@pytest.mark.slow
def test_taskflow_runs_on_the_device_asked(sampan_home):
    from sampan.taskflow import Taskflow

    cpu = Taskflow("sentiment_analysis", device="cpu")
    assert cpu.task.device == "cpu" and cpu.task.loaded.predictor.device == "cpu"
    out = cpu("这家餐厅的服务非常棒")
    assert out[0]["label"] == "positive"
    auto = Taskflow("sentiment_analysis")  # the default, "auto": the CPU with plain onnxruntime
    assert auto.task.device == "auto"
    assert auto.task.loaded.predictor.device == ("cuda:0" if ORT_GPU else "cpu")
    if ORT_GPU:
        assert auto("这家餐厅的服务非常棒")[0]["label"] == "positive"
    else:
        assert auto("这家餐厅的服务非常棒") == out  # the same predictor, on the same CPU
    if TORCH_GPU:
        gpu = Taskflow("sentiment_analysis", device="cuda", backend="torch")
        assert gpu.task.loaded.predictor.device.startswith("cuda")
        assert gpu("这家餐厅的服务非常棒")[0]["label"] == "positive"


# --- the CLI verbs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("verb", ["task", "serve", "export"])
def test_device_is_in_the_help(verb):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit:
        cli_main([verb, "--help"])
    assert exit.value.code == 0
    text = " ".join(out.getvalue().split())  # argparse wraps the help text
    assert "--device DEVICE" in text and "cuda:N" in text
    assert ("onnxruntime-gpu" in text) and ("traced on the CPU" in text if verb == "export" else True)


def _sampan_without_gpu(home: Path, *argv: str) -> tuple[int, str, str]:
    """``sampan ARGV`` in a fresh process that sees no GPU (``CUDA_VISIBLE_DEVICES=""``): what a
    CPU-only machine answers, on any machine."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "SAMPAN_HOME": str(home), "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([sys.executable, "-m", "sampan.cli", *argv], capture_output=True, text=True, timeout=600,
                         env=env)
    return run.returncode, run.stdout, run.stderr


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-2000:]
    return lines[0]


def test_cli_task_on_a_missing_gpu_is_one_line_and_status_2(sampan_home):
    rc, out, err = _sampan_without_gpu(sampan_home, "task", "sentiment_analysis", "好", "--device", "cuda")
    assert rc == 2 and out == ""
    line = _one_line(err)
    assert line.startswith("sampan task: error: device 'cuda'")
    if not ORT_GPU:  # the plain onnxruntime wheel: the fix is the other wheel, and it is said before any export
        assert "has no CUDAExecutionProvider" in line and "pip install onnxruntime-gpu" in line
        assert not (sampan_home / "cache").exists()


def test_cli_task_refuses_the_device_as_an_option(capsys):
    assert cli_main(["task", "word_segmentation", "我爱北京", "--option", "device=cpu"]) == 2
    assert "--option device=...: sampan task has a flag for it; use --device" in capsys.readouterr().err


def test_cli_serve_checks_the_device_before_serving(sampan_home, tiny):
    rc, _, err = _sampan_without_gpu(sampan_home, "serve", "--model-dir", f"tiny={tiny['dir']}", "--device", "cuda:0")
    assert rc == 2
    assert _one_line(err).startswith("sampan serve: error: device 'cuda:0'")
    rc, _, err = _sampan_without_gpu(sampan_home, "serve", "--task", "ner", "--task-option", "ner.device=cpu")
    assert rc == 2 and "sampan serve sets it for every task; use --device" in _one_line(err)


def test_served_model_reports_its_device(tiny):
    from sampan.serving.models import ServedModel

    served = ServedModel("tiny", tiny["dir"], device="cpu")
    assert served.info()["device"] == "cpu"
    request = served.parse({"input_ids": _ids().tolist()}, max_rows=8)
    logits = np.asarray(served.run_batch([request])[0]["logits"])
    np.testing.assert_allclose(logits, create_predictor(Config(tiny["dir"])).run([_ids()])[0], atol=1e-6)


def test_cli_export_checks_the_device_before_loading_the_model(tmp_path):
    rc, _, err = _sampan_without_gpu(tmp_path, "export", "--model-dir", str(tmp_path / "nowhere"),
                                     "--out", str(tmp_path / "out"), "--device", "cuda")
    assert rc == 2  # the device, not the missing model directory, is what it reports first
    line = _one_line(err)
    assert line.startswith("sampan export: error: device 'cuda' asked for, but torch") and "sees no CUDA GPU" in line


@pytest.mark.slow
def test_cli_export_says_where_it_checked(tmp_path):
    from sampan.models.registry import create

    torch.manual_seed(0)
    model = create("gpt-tiny", num_layers=1, hidden_size=64, num_heads=2, vocab_size=500)
    model_dir = model.save_pretrained(tmp_path / "gpt")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli_main(["export", "--model-dir", str(model_dir), "--out", str(tmp_path / "out"), "--device", "auto"])
    assert rc == 0
    printed = json.loads(out.getvalue())
    assert printed["checked_on"] == {"torch": "cuda:0" if TORCH_GPU else "cpu",
                                     "onnxruntime": "cuda:0" if ORT_GPU else "cpu"}
    # The files are the same whatever the check ran on: the program's devices are the CPU's.
    program = torch.export.load(Path(printed["out"]) / "inference.pt2")
    assert {t.device.type for t in program.state_dict.values()} == {"cpu"}
    assert check_device_spec("cpu") == "cpu" and predictor_device("cpu", "torch") == "cpu"

"""``sampan plan --from-run``: a real tiny Trainer run (one process, and pp2 on two gloo ranks) read back.

The runs train a 2-layer GPT for 4 steps with the Trainer, which writes ``metrics.jsonl``, a
checkpoint with its arguments (and, on fleet, the degrees) and ``model/config.json``; the test then
checks the report against those files: the layout and sequence length recovered, the data wait as
measured, the attributed components adding up to the measured step, and the prediction's shape.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from sampan.cli import main

SCRIPT = '''
import json, sys
import numpy as np
import torch
from sampan.io import TokenWindowDataset
from sampan.models import create
from sampan.trainer import Trainer, TrainingArguments

out, strategy = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else None
torch.set_num_threads(1)
tokens = np.random.default_rng(0).integers(0, 64, size=2000)
torch.manual_seed(0)
model = create("gpt-tiny", vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=16)
args = TrainingArguments(output_dir=out, max_steps=4, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                         logging_steps=1, peak_flops=5e9, tensorboard=False, progress_bar=False, seed=0,
                         strategy=strategy)
trainer = Trainer(model, args, TokenWindowDataset(tokens, seq_len=16))
trainer.train()
trainer.save_pretrained(f"{out}/model")
if trainer.fleet is not None:
    from sampan.distributed.env import shutdown
    shutdown()
'''

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _start_pp2(tmp: Path, script: Path) -> tuple[list[subprocess.Popen], Path]:
    """Two gloo ranks started directly with the launcher's environment (no torchrun process: one
    torch import fewer on a loaded machine)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp / "pp2"
    cmd = [sys.executable, str(script), str(out), json.dumps({"hybrid_configs": {"pp_degree": 2}})]
    procs = []
    for rank in range(2):
        env = {**ENV, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    return procs, out


def _train_here(script: Path, out: Path) -> None:
    """The one-process run in this interpreter (torch is imported once, not again in a subprocess)."""
    import runpy

    import torch

    argv, threads = sys.argv, torch.get_num_threads()
    sys.argv = [str(script), str(out)]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("planner_runs")
    script = tmp / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    procs, pp2 = _start_pp2(tmp, script)  # two gloo ranks start while the one-process run trains here
    try:
        _train_here(script, tmp / "one")
        errors = [proc.communicate(timeout=300)[1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, err in zip(procs, errors, strict=True):
        assert proc.returncode == 0, err[-3000:]
    return {"one": tmp / "one", "pp2": pp2}


def _report(capsys, out: Path, *extra: str) -> dict:
    assert main(["plan", "--from-run", str(out), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _windows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["kind"] == "train"]
    return train[1:]  # the report leaves the warm-up window out


@pytest.mark.slow
@pytest.mark.multiprocess
def test_one_process_run_is_read_back(runs, capsys):
    out = runs["one"]
    report = _report(capsys, out)
    run, windows = report["run"], _windows(out)
    assert (run["world_size"], run["seq_len"], run["global_batch"], run["steps"]) == (1, 16, 8, 4)
    lay = run["layout"]
    assert (lay["dp"], lay["mp"], lay["pp"], lay["micro_batch"], lay["num_micro"]) == (1, 1, 1, 4, 2)
    assert run["step_time_s"] == pytest.approx(statistics.median(w["step_time_sec"] for w in windows))
    wait = {r["component"]: r for r in report["breakdown"]}["data wait"]
    assert wait["run_s"] == pytest.approx(statistics.median(w["data_wait_pct"] / 100 * w["step_time_sec"]
                                                             for w in windows))
    assert sum(r["run_s"] for r in report["breakdown"]) == pytest.approx(run["step_time_s"])
    assert report["hardware"]["tflops"] == pytest.approx(5e9 / 1e12)  # the run's peak_flops, per rank
    assert report["model"]["hidden"] == 32 and report["model"]["layers"] == 2
    parts = {r["component"]: r["predicted_s"] for r in report["breakdown"]}
    assert parts["compute"] > 0 and parts["pipeline bubble"] == 0 and parts["tensor-parallel comm"] == 0
    assert report["predicted"]["step_time_s"] == pytest.approx(sum(parts.values()))
    assert any("peak_flops" in note for note in report["assumptions"])


@pytest.mark.slow
@pytest.mark.multiprocess
def test_pipeline_run_shows_a_bubble(runs, capsys):
    report = _report(capsys, runs["pp2"])
    run = report["run"]
    assert run["world_size"] == 2 and run["layout"]["pp"] == 2 and run["seq_len"] == 16
    rows = {r["component"]: r for r in report["breakdown"]}
    assert rows["pipeline bubble"]["predicted_s"] > 0 and rows["pipeline p2p"]["predicted_s"] > 0
    assert rows["pipeline bubble"]["run_s"] > 0  # attributed in the model's proportion
    # two micro-batches over two stages: the bubble is one slot of the two, as (p - 1) / m says
    assert rows["pipeline bubble"]["predicted_s"] == pytest.approx(
        (rows["compute"]["predicted_s"] + rows["tensor-parallel comm"]["predicted_s"]) / 2)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_table_and_gpu_hardware(runs, capsys):
    assert main(["plan", "--from-run", str(runs["pp2"])]) == 0
    text = capsys.readouterr().out
    assert "where the step went" in text and "pipeline bubble" in text and "assumption:" in text
    report = _report(capsys, runs["one"], "--hardware", "a100-80g")
    assert report["hardware"]["name"] == "a100-80g" and report["predicted"]["step_time_s"] < report["run"]["step_time_s"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("extra, message", [(["--gpus", "8"], "does not apply to --from-run"),
                                            (["--fix", "dp=1"], "does not apply to --from-run")])
def test_from_run_refuses_planning_flags(runs, capsys, extra, message):
    assert main(["plan", "--from-run", str(runs["one"]), *extra]) == 2
    assert message in capsys.readouterr().err


def test_from_run_says_what_is_missing(tmp_path, capsys):
    assert main(["plan", "--from-run", str(tmp_path), "--model", "gpt-tiny"]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err
    assert main(["plan", "--from-run", str(tmp_path)]) == 2
    assert "model/config.json" in capsys.readouterr().err

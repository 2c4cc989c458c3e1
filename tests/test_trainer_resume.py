"""Exact resume: a run killed with SIGKILL and resumed ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "train_tiny.py"


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, str(SCRIPT), str(out), *extra], capture_output=True, text=True,
                          env=env, timeout=240)


def _losses(out: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == sorted(set(steps)), f"metrics.jsonl repeats or reorders steps: {steps}"
    return {r["step"]: r["loss"] for r in records if r["kind"] == "train"}


def _final_bytes(out: Path, step: int) -> dict[str, bytes]:
    ckpt = out / f"checkpoint-{step:08d}"
    return {name: (ckpt / name).read_bytes() for name in ("model.safetensors", "optimizer.safetensors")}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers, model", [(0, ["--family", "gpt"]), (2, ["--family", "gpt"]),
                                            (0, ["--family", "llama", "--recompute", "full"])])
def test_sigkill_then_auto_resume_is_bit_identical(tmp_path, workers, model):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = _run(straight, "--workers", str(workers), *model)
    assert done.returncode == 0, done.stderr

    # Killed right after step 7: the newest checkpoint is step 4, steps 5-7 must be redone.
    crash = _run(killed, "--workers", str(workers), "--kill-at", "7", *model)
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    assert sorted(p.name for p in killed.glob("checkpoint-*")) == ["checkpoint-00000004"]
    assert max(_losses(killed)) == 6  # logged past its checkpoint (killed before logging step 7)

    resumed = _run(killed, "--workers", str(workers), "--resume", "auto", *model)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "at step 4" in resumed.stdout

    assert _losses(killed) == _losses(straight)  # the whole loss curve, bit for bit, steps 1..12
    assert sorted(_losses(straight)) == list(range(1, 13))
    assert _final_bytes(killed, 12) == _final_bytes(straight, 12)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_corrupt_newest_checkpoint_falls_back_to_previous_good_one(tmp_path):
    out = tmp_path / "run"
    first = _run(out, "--max-steps", "8")
    assert first.returncode == 0, first.stderr
    weights = out / "checkpoint-00000008" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF  # flip bits inside a tensor
    weights.write_bytes(bytes(data))

    again = _run(out, "--max-steps", "12", "--resume", "auto")
    assert again.returncode == 0, again.stderr
    assert "checkpoint-00000008" in again.stderr and "sha256" in again.stderr
    assert "at step 4" in again.stdout

    reference = tmp_path / "reference"
    assert _run(reference, "--max-steps", "12").returncode == 0
    # Resumed from step 4 of an 8-step schedule into a 12-step one: the LR schedule differs from
    # the reference after step 4, so only the shared prefix is comparable.
    assert {k: v for k, v in _losses(out).items() if k <= 4} == {k: v for k, v in _losses(reference).items() if k <= 4}
    assert sorted(_losses(out)) == list(range(1, 13))

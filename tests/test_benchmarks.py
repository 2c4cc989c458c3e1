"""Benchmarks stay runnable: each one's --quick mode runs and checks its own equal-work guard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_model_step_quick(tmp_path):
    out = tmp_path / "model_step.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_step.py"), "--quick", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=280)
    result = json.loads(out.read_text())
    # The benchmark refuses to time unequal work: same parameter count and the same loss.
    assert result["loss_match"]["max_abs_diff"] <= result["loss_match"]["tolerance"]
    assert result["params"] > 0 and result["flops_per_step"] > 0
    assert result["sampan"]["median_step_s"] > 0 and result["baseline"]["median_step_s"] > 0
    assert set(result["optimizer_kernels_ms"]) == {"default_loop", "fused"}

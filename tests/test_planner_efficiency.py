"""The compute-efficiency curve and the published-run validation it was fitted and checked on.

The shipped curve's constants must be the ones ``benchmarks/planner.py`` fitted (committed in
``benchmarks/results/planner.json``), and the committed predictions must be what the planner
computes today for the same rows, so docs/planner.md's validation table describes this code.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from sampan.planner import get_hardware, load_model
from sampan.planner.hardware import EFFICIENCY_H0, EFFICIENCY_MAX
from sampan.planner.search import evaluate

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def results() -> dict:
    path = ROOT / "benchmarks" / "results" / "planner.json"
    assert path.is_file(), "benchmarks/results/planner.json is missing (run benchmarks/planner.py)"
    return json.loads(path.read_text())["published"]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("planner_bench", ROOT / "benchmarks" / "planner.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_curve_is_the_fitted_one(results):
    assert EFFICIENCY_MAX == pytest.approx(results["curve"]["efficiency_max"], rel=1e-12)
    assert EFFICIENCY_H0 == pytest.approx(results["curve"]["efficiency_h0"], rel=1e-12)


def test_curve_rises_with_width_and_saturates():
    hw = get_hardware("a100-80g")
    widths = [768, 2304, 4096, 12288, 25600, 10**7]
    effs = [hw.efficiency(h) for h in widths]
    assert effs == sorted(effs) and effs[0] < 0.9 * effs[-1]
    assert effs[-1] == pytest.approx(hw.efficiency_max, rel=1e-3) and all(e < hw.efficiency_max for e in effs)
    fixed = get_hardware("a100-80g", matmul_efficiency=0.5)
    assert {fixed.efficiency(h) for h in widths} == {0.5}
    with pytest.raises(ValueError, match="matmul efficiency"):
        get_hardware("a100-80g", matmul_efficiency=1.5)


def test_wider_models_run_closer_to_peak():
    """Same layout, same FLOPs per GPU-second budget: the 175B shape reaches a higher MFU than the 13B one."""
    from sampan.planner import Layout, Workload

    hw, work = get_hardware("a100-80g"), Workload(2048, 64)
    layout = Layout(dp=1, mp=8, pp=1, micro_batch=1, num_micro=64)
    small, big = evaluate(load_model("gpt-13b"), layout, work, hw), evaluate(load_model("gpt-175b"), layout, work, hw)
    assert big.time.compute / big.time.total > 0.5
    assert hw.efficiency(12288) > hw.efficiency(5120)
    assert big.mfu > small.mfu


def test_committed_predictions_are_what_the_planner_computes(results, bench):
    rows = bench._published_rows()
    assert len(rows) == len(results["rows"]) == 16
    for row, saved in zip(rows, results["rows"], strict=True):
        hw = dataclasses.replace(row["hw"], **results["curve"])
        plan = evaluate(row["model"], row["layout"], row["work"], hw)
        predicted = row["flops"] / plan.time.total / row["gpus"] / 1e12
        assert predicted == pytest.approx(saved["predicted_tflops_per_gpu"], rel=1e-9), (row["source"], row["gpus"])
        # bit for bit: a change to the shapes or formulas that moves a GPT row needs the fit rerun
        assert plan.time.total == saved["predicted_step_s"], (row["source"], row["gpus"])
        assert plan.memory.total / 1e9 == saved["predicted_memory_gb"], (row["source"], row["gpus"])
        assert saved["published_tflops_per_gpu"] == row["published"]
        assert saved["calibration_row"] == row["calibration_row"]


def test_committed_memory_predictions_are_what_the_planner_computes(bench):
    """Part 1 of the benchmark (per-rank model state of 11 fleet layouts, activations per recompute mode)."""
    saved = json.loads((ROOT / "benchmarks" / "results" / "planner.json").read_text())["memory"]
    now = bench.part_memory()
    assert [r["predicted"] for r in now["state"]] == [r["predicted"] for r in saved["state"]]
    assert [r["predicted_bytes"] for r in now["activations"]] == [r["predicted_bytes"] for r in saved["activations"]]


def test_reported_summaries_follow_from_the_rows(results):
    held = [r for r in results["rows"] if not r["calibration_row"]]
    assert len(held) == results["held_out"]["rows"] == 11
    assert sum(abs(r["error_pct"]) <= 15 for r in held) == results["held_out"]["within_15pct"]
    assert len([r for r in results["rows"] if r["calibration_row"]]) == 5  # fitted on 5 of 16, never per row
    folds = results["leave_one_out_megatron"]["folds"]
    assert len(folds) == 13 and sum(abs(f["error_pct"]) <= 15 for f in folds) == \
        results["leave_one_out_megatron"]["within_15pct"]


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of the markdown table that starts with ``header``."""
    lines = text[text.index(header):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


@pytest.mark.parametrize("doc, header, predicted_col", [
    ("docs/planner.md", "| source | model | GPUs | layout (t, p, d) |", 5),
])
def test_published_tables_match_the_results(results, doc, header, predicted_col):
    rows = _table_rows((ROOT / doc).read_text(encoding="utf-8"), header)
    assert len(rows) == len(results["rows"])
    for cells, saved in zip(rows, results["rows"], strict=True):
        assert float(cells[predicted_col - 1]) == saved["published_tflops_per_gpu"]
        assert float(cells[predicted_col]) == pytest.approx(saved["predicted_tflops_per_gpu"], abs=0.051)

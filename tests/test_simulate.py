"""``sampan simulate``: fleet's real code on one rank at a time, under the fake process group.

The fast tests drive the verb (help, a 4-rank simulation with its JSON, a bad layout's one-line
error). The slow one trains one real step on 8 gloo ranks (dp2 x mp2 x pp2) and holds every rank's
simulated parameter / gradient / optimizer bytes to what the real rank held.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ranks import run_ranks

from sampan.cli import main

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).parent / "scripts" / "simulate_real.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    return code, out.getvalue(), err.getvalue()


def test_help_names_every_flag():
    code, out, _ = _run(["simulate", "--help"])
    assert code == 0
    for flag in ("--model", "--gpus", "--fix", "--strategy", "--seq-len", "--global-batch", "--stages", "--rank",
                 "--num-micro", "--json", "--gpu-memory-gb", "--fp32", "docs/scale.md"):
        assert flag in out, flag


def test_the_help_imports_no_torch():
    probe = ("import contextlib, io, sys\nfrom sampan.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n        main(['simulate', '--help'])\n    except SystemExit:\n        pass\n"
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:3])")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"


@pytest.mark.parametrize(("argv", "message"), [
    (["--fix", "mp=3"], "mp_degree 3 does not divide the model's 4 attention heads"),
    (["--fix", "cp=2", "--seq-len", "66"], "use a length that is a multiple of 4"),
    (["--fix", "amp=O2", "--fp32"], "amp level O2 needs bf16"),
    (["--strategy", '{"hybrid_configs": {"dp_degree": 3}}'], "their product must equal the number of ranks"),
    ([], "--fix"),
])
def test_a_bad_layout_is_one_line(argv, message):
    gpus = "6" if "mp=3" in argv else "4"
    code, out, err = _run(["simulate", "--model", "gpt-tiny", "--gpus", gpus, "--seq-len", "64",
                           "--global-batch", "12", *argv])
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sampan simulate: error: "), err
    assert message in lines[0], lines[0]


@pytest.mark.timeout(180)
def test_a_hugging_face_config_json_is_a_model(tmp_path):
    """--model takes a Hugging Face config.json (a Qwen2 shape at test size), as `sampan plan` does."""
    from transformers import Qwen2Config

    Qwen2Config(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512).save_pretrained(tmp_path)
    code, out, err = _run(["simulate", "--model", str(tmp_path / "config.json"), "--gpus", "4", "--fix",
                           "mp=2,pp=2,sp=true,amp=O2", "--seq-len", "64", "--global-batch", "4", "--json"])
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["label"] == "dp1 sh1 pp2 mp2+sp O2" and len(report["ranks"]) == 2
    for row in report["ranks"]:
        assert row["ratio"]["params"] == pytest.approx(1.0, abs=1e-3)
        assert row["ratio"]["total"] == pytest.approx(1.0, abs=0.05)


@pytest.mark.timeout(180)
def test_a_small_simulation_reports_state_exactly_as_planned():
    """dp2 x mp2 on 4 fake ranks: model state per rank is what the planner's closed forms say."""
    code, out, err = _run(["simulate", "--model", "gpt-tiny", "--gpus", "4", "--fix", "mp=2,micro_batch=2",
                           "--seq-len", "64", "--global-batch", "8", "--json"])
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["label"] == "dp2 sh1 pp1 mp2" and len(report["ranks"]) == 1
    row = report["ranks"][0]
    for key in ("params", "grads", "optimizer"):
        assert row["ratio"][key] == pytest.approx(1.0, abs=1e-3), key
    sim = row["simulated_bytes"]
    assert sim["params"] == sim["grads"] and sim["optimizer"] > 2 * sim["params"]  # exp_avg, exp_avg_sq, step
    assert sim["total"] > sim["params"] + sim["grads"] + sim["optimizer"]
    assert row["collectives"]["all_reduce"]["calls"] > 0  # tensor parallel and the data-parallel gradients
    assert any("answered with 1" in note for note in row["notes"])


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("gpus", "fix", "expert_shards", "state_tol", "peak_tol"), [
    (8, "dp=1,sharding=4,pp=2,ep=2,micro_batch=1,amp=O2,recompute=full", 2, 1e-3, 0.05),
    # 4 local experts over 3 shard ranks, and no dimension of [4, 64, 64] / [4, 64, 32] splits in 3:
    # FSDP2 pads every rank to 2 experts (1.5x the state an even split holds), and the planner must
    # say so. It also pads the dense weights' rows over the 6 sharding ranks (64 to 66), and their
    # gathered copies, which the planner leaves out: 2% of the state and 11% of the peak at this
    # width, nothing at real widths (benchmarks/scale.json holds those to 5%).
    (12, "dp=1,sharding=6,pp=2,ep=2,micro_batch=1,amp=O2", 3, 0.03, 0.15),
])
def test_an_moe_layout_routes_as_planned_and_matches_the_planner(gpus, fix, expert_shards, state_tol, peak_tol):
    """Expert parallelism under the fake group: the blocks route by the planned loads (the router's
    counts have no values on fake tensors), tokens cross all-to-alls, and each rank's state and
    peak are the planner's."""
    code, out, err = _run(["simulate", "--model", "qwen3-moe-tiny", "--gpus", str(gpus), "--fix", fix,
                           "--seq-len", "64", "--global-batch", str(gpus), "--json"])
    assert code == 0, err[-3000:]
    report = json.loads(out)
    assert report["layout"]["ep"] == 2 and len(report["ranks"]) == 2
    for row in report["ranks"]:
        for key in ("params", "grads", "optimizer"):
            assert row["ratio"][key] == pytest.approx(1.0, abs=state_tol), (row["rank"], key)
        assert row["ratio"]["total"] == pytest.approx(1.0, abs=peak_tol), row["rank"]
        assert row["collectives"]["all_to_all"]["calls"] > 0
    from sampan.planner.layout import Workload, parse_fix
    from sampan.planner.memory import expert_shard_divisor
    from sampan.planner.model_shape import load_model

    layout = parse_fix(fix, gpus, Workload(64, gpus, "bf16"))
    assert layout.expert_shard_ranks == expert_shards
    padded = 4 % expert_shards != 0
    assert expert_shard_divisor(load_model("qwen3-moe-tiny"), layout) == (2 if padded else expert_shards)


# Three 8-rank layouts: the plain hybrid one, and two with the memory features of docs/scale.md
# (sequence parallel inside a pipeline with ZeRO-3 and bf16 parameters; context parallel with them).
REAL_LAYOUTS = {
    "gpt dp2 x mp2 x pp2": ("gpt-tiny", {"hybrid_configs": {"dp_degree": 2, "mp_degree": 2, "pp_degree": 2},
                                         "pipeline_configs": {"accumulate_steps": 2}}),
    "llama sharding2 x mp2+sp x pp2, ZeRO-3, O2": (
        "llama-tiny", {"hybrid_configs": {"sharding_degree": 2, "mp_degree": 2, "pp_degree": 2},
                       "sharding_configs": {"stage": 3}, "pipeline_configs": {"accumulate_steps": 2},
                       "tensor_parallel_configs": {"sequence_parallel": True}, "amp": "bf16",
                       "amp_configs": {"level": "O2"}}),
    "llama sharding2 x cp2 x mp2, O2": (
        "llama-tiny", {"hybrid_configs": {"sharding_degree": 2, "cp_degree": 2, "mp_degree": 2},
                       "pipeline_configs": {"accumulate_steps": 2}, "amp": "bf16", "amp_configs": {"level": "O2"}}),
}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(400)
@pytest.mark.parametrize("layout", sorted(REAL_LAYOUTS))
def test_simulated_state_bytes_equal_a_real_8_rank_run(layout, tmp_path):
    """One real AdamW step on 8 gloo ranks against the simulation of the same layout.

    The first and the last rank are simulated; every real rank is held to the simulated rank of its
    pipeline stage, since the ranks of one stage hold equal shares."""
    from sampan.distributed.simulate import simulate
    from sampan.distributed.strategy import DistributedStrategy

    model, strategy = REAL_LAYOUTS[layout]
    run = run_ranks(SCRIPT, [str(tmp_path), model, json.dumps(strategy), "8", "64"], 8, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    real = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(8)}
    parsed = DistributedStrategy.from_dict(strategy)
    simulated = simulate(model, parsed, 8, 8, 64, ranks=[0, 7], amp=parsed.amp is not None)
    pp = parsed.hybrid_configs.pp_degree
    assert set(simulated[0]["coords"].values()) == {0} and simulated[1]["coords"]["pp"] == pp - 1
    by_stage = {sim["coords"]["pp"]: sim for sim in simulated}
    for rank, held in real.items():
        sim = by_stage[rank // (8 // pp)]  # pp is the outermost mesh axis
        for key in ("params", "grads", "optimizer"):
            assert sim[key] == pytest.approx(held[key], rel=0.02), (rank, key)
    if parsed.hybrid_configs.pp_degree > 1:  # the stages hold different amounts (embedding vs norm and head)
        assert simulated[0]["params"] != simulated[1]["params"]


def test_committed_simulations_agree_with_the_planner():
    """benchmarks/results/scale.json holds `sampan simulate` runs of today's 100B+ layouts; the
    planner's memory model, as it is now, must price every simulated rank within 5%; Llama 3 405B
    at Meta's layout must fit 80 GB with sequence parallel, O2 and full recompute, and DeepSeek-V3 and
    ERNIE-4.5-300B at their published layouts with O2 and full recompute."""
    import importlib.util

    from sampan.planner.layout import Workload, parse_fix
    from sampan.planner.memory import stage_memory
    from sampan.planner.model_shape import load_model

    spec = importlib.util.spec_from_file_location("scale_bench", ROOT / "benchmarks" / "scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = json.loads((ROOT / "benchmarks" / "results" / "scale.json").read_text())["layouts"]
    assert set(results) == set(bench.LAYOUTS)
    for name, (model, gpus, fix, seq, batch, _) in bench.LAYOUTS.items():
        work = Workload(seq, batch, "bf16")
        layout = parse_fix(fix, gpus, work)
        shape = load_model(model)
        for rank in results[name]["ranks"]:
            planned = stage_memory(shape, layout, work, rank["pipeline_rank"])
            ratio = rank["simulated"]["total"] / (planned.total - planned.reserved)
            assert abs(ratio - 1) <= 0.05, (name, rank["rank"], ratio)
    features = results["llama3-405b-meta-features"]
    assert features["fits_80gb"] and features["worst_needs_gb"] < 80
    assert not results["llama3-405b-meta-full"]["fits_80gb"]  # without the features it does not
    # The MoE layouts at their published shapes (issue 38), every pipeline rank simulated.
    for name, stages in (("deepseek-v3-published", 16), ("ernie4.5-300b-published", 12)):
        assert results[name]["fits_80gb"] and results[name]["worst_needs_gb"] < 80, name
        assert sorted(r["pipeline_rank"] for r in results[name]["ranks"]) == list(range(stages)), name

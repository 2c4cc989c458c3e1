"""The Trainer on fleet: a strategy in TrainingArguments trains the same run on several ranks.

``tests/scripts/trainer_fleet.py`` trains a tiny GPT for 6 steps (2 micro-batches each, cosine
schedule with warmup, clipping, evaluation and a checkpoint every 3 steps). Run as one process,
on dp2 x mp2, and resumed from the dp2 x mp2 checkpoint at pp2 and in one process, it must log the
same losses, gradient norms and eval losses; killed mid-run under ``sampan launch`` (with dropout on, so
every rank's RNG stream must come back), it must end bit-identical to the uninterrupted run.
With ``compile=True`` on dp2 x mp2 it must log the eager one-process figures too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ranks import run_ranks

from sampan.checkpoint import verify_checkpoint
from sampan.runfile import RunConfig
from sampan.trainer import TrainingArguments

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

SCRIPT = Path(__file__).parent / "scripts" / "trainer_fleet.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(nproc: int, out: Path, *args: str, timeout: int = 300) -> None:
    """The script on ``nproc`` gloo ranks (forked from a zygote: tests/ranks.py), or alone for 1.
    The elastic-restart test below goes through ``sampan launch`` and torchrun for real."""
    run = run_ranks(SCRIPT, [str(out), *args], nproc, timeout=timeout, distributed=nproc > 1)
    assert run.returncode == 0, run.stderr[-3000:]


def _metrics(out: Path) -> dict[int, dict[str, float]]:
    """step -> {"loss", "grad_norm", "eval_loss"} from metrics.jsonl."""
    by_step: dict[int, dict[str, float]] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key in ("loss", "grad_norm", "eval_loss"):
            if key in row:
                by_step.setdefault(row["step"], {})[key] = row[key]
    return by_step


def _assert_same(got: dict, want: dict, steps) -> None:
    for step in steps:
        assert set(got[step]) == set(want[step]), step
        for key, value in want[step].items():
            assert got[step][key] == pytest.approx(value, rel=1e-5), f"step {step} {key}"


DP2_MP2 = json.dumps({"hybrid_configs": {"dp_degree": 2, "mp_degree": 2}})


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "one"
    _run(1, out, "--batch", "8")
    return out


@pytest.fixture(scope="module")
def dp2_mp2(tmp_path_factory) -> Path:
    """dp2 x mp2 on 4 ranks, 4 samples per data rank: the same global batches as one process."""
    out = tmp_path_factory.mktemp("runs") / "dp2xmp2"
    _run(4, out, "--batch", "4", "--strategy", DP2_MP2)
    return out


@pytest.fixture(scope="module")
def dp2_mp2_dropout(tmp_path_factory) -> Path:
    """dp2 x mp2 with dropout 0.1, uninterrupted: what the killed-and-restarted run must end equal to."""
    out = tmp_path_factory.mktemp("runs") / "dp2xmp2-dropout"
    _run(4, out, "--batch", "4", "--strategy", DP2_MP2, "--dropout", "0.1")
    return out


@pytest.mark.timeout(300)
def test_trainer_with_a_strategy_matches_one_process(one_process, dp2_mp2):
    want = _metrics(one_process)
    assert sorted(want) == [1, 2, 3, 4, 5, 6] and "eval_loss" in want[3] and "eval_loss" in want[6]
    _assert_same(_metrics(dp2_mp2), want, range(1, 7))
    checkpoint = dp2_mp2 / "checkpoint-00000003"
    assert (checkpoint / ".metadata").is_file()
    assert verify_checkpoint(checkpoint) == []  # DCP shards + trainer state under one manifest
    # save_pretrained wrote the whole model from the split one: it is the final checkpoint's.
    import torch

    from sampan.models import GPTForCausalLM

    saved = GPTForCausalLM.from_pretrained(dp2_mp2 / "model").state_dict()
    final = _final_parameters(dp2_mp2)
    assert sorted(saved) == sorted(final)
    assert all(torch.equal(saved[name], final[name]) for name in final)


@pytest.mark.timeout(400)
def test_compiled_blocks_on_tensor_parallel_and_sharding_match_one_process(one_process, tmp_path):
    """``compile=True`` on dp2 x mp2 (DTensor tensor parallel, FSDP2 sharding over dp): every
    rank compiles its blocks after tensor parallel and recompute, before sharding, and the run logs
    the eager one-process losses, gradient norms and eval losses (the script asserts the blocks
    were really compiled)."""
    out = tmp_path / "compiled"
    _run(4, out, "--batch", "4", "--strategy", DP2_MP2, "--compile", timeout=380)
    _assert_same(_metrics(out), _metrics(one_process), range(1, 7))


@pytest.mark.timeout(300)
def test_fleet_checkpoint_resumes_at_another_layout_and_in_one_process(one_process, dp2_mp2, tmp_path):
    want = _metrics(one_process)
    checkpoint = dp2_mp2 / "checkpoint-00000003"
    staged = tmp_path / "pp2"  # two pipeline stages, 8 samples on the one data rank
    _run(2, staged, "--batch", "8", "--strategy", json.dumps({"hybrid_configs": {"pp_degree": 2}}),
         "--resume", str(checkpoint))
    _assert_same(_metrics(staged), want, range(4, 7))
    single = tmp_path / "one-resumed"
    _run(1, single, "--batch", "8", "--resume", str(checkpoint))
    _assert_same(_metrics(single), want, range(4, 7))


@pytest.mark.timeout(400)
def test_killed_rank_restarts_the_group_which_resumes_and_ends_bit_identical(dp2_mp2, dp2_mp2_dropout, tmp_path):
    """``sampan launch --max_restarts 1``: one of 4 ranks SIGKILLs itself after step 5; torchrun
    restarts the group, ``resume_from_checkpoint="auto"`` picks checkpoint 3, and the run ends with
    exactly the parameters of the uninterrupted dp2 x mp2 run. Both run with dropout 0.1, so each
    step consumes every rank's torch RNG: only restoring each rank's saved stream gets steps 4-6
    bit-identical (with dropout 0 a resume that reseeded or skipped the RNG would pass unnoticed)."""
    import torch

    # The dropout is really on: the same run without it logs other losses from step 1.
    assert _metrics(dp2_mp2_dropout)[1]["loss"] != _metrics(dp2_mp2)[1]["loss"]
    out = tmp_path / "killed"
    run = subprocess.run([sys.executable, "-m", "sampan.cli", "launch", "--nproc_per_node", "4", "--max_restarts", "1",
                          str(SCRIPT), str(out), "--batch", "4", "--strategy", DP2_MP2, "--resume", "auto",
                          "--kill-rank", "2", "--kill-step", "5", "--dropout", "0.1"],
                         capture_output=True, text=True, env=ENV, timeout=380)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "rank 2: killing myself after step 5" in run.stderr
    assert f"resumed from {out / 'checkpoint-00000003'} at step 3" in run.stdout
    # metrics.jsonl was cut back to step 3, then rewritten: losses, gradient norms and eval losses equal
    assert _metrics(out) == _metrics(dp2_mp2_dropout)

    want, have = _final_parameters(dp2_mp2_dropout), _final_parameters(out)
    assert sorted(have) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(have[name], tensor), name


def _final_parameters(run_dir: Path) -> dict:
    """The parameters of a run's step-6 checkpoint, loaded into one unsplit model."""
    from sampan.distributed.checkpoint import load_distributed
    from sampan.models import create

    model = create("gpt-tiny", vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, max_position_embeddings=16)
    load_distributed(run_dir / "checkpoint-00000006", model)
    return model.state_dict()


def test_strategy_is_validated_with_the_arguments():
    args = TrainingArguments(strategy={"hybrid_configs": {"dp_degree": 2}})
    assert args.strategy["hybrid_configs"]["dp_degree"] == 2
    with pytest.raises(ValueError, match="unknown key"):
        TrainingArguments(strategy={"hybrid_configs": {"dp_degre": 2}})
    with pytest.raises(ValueError, match="strategy must be dict"):
        TrainingArguments(strategy="dp2")


@pytest.mark.parametrize(("args", "message"), [
    ({"gradient_accumulation_steps": 2, "strategy": {"pipeline_configs": {"accumulate_steps": 4}}},
     "accumulate_steps=4 disagrees with gradient_accumulation_steps=2"),
    ({"recompute": "full", "strategy": {"recompute": "selective"}}, "disagrees with recompute='full'"),
    ({"amp": "fp16", "strategy": {}}, "amp='fp16'"),
])
def test_strategy_and_trainer_settings_must_agree(args, message):
    from sampan.trainer.fleet_backend import strategy_for

    with pytest.raises(ValueError, match=message):
        strategy_for(TrainingArguments(**args))


def test_strategy_takes_the_trainers_accumulation_and_recompute():
    from sampan.trainer.fleet_backend import strategy_for

    strategy = strategy_for(TrainingArguments(gradient_accumulation_steps=4, recompute="full", amp="bf16",
                                              strategy={"hybrid_configs": {"pp_degree": 2}}))
    assert strategy.pipeline_configs.accumulate_steps == 4
    assert (strategy.recompute, strategy.amp) == ("full", "bf16")


def test_run_config_reads_a_strategy_table(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[model]\nname = "gpt-tiny"\n[training]\nmax_steps = 3\n'
                    '[strategy.hybrid_configs]\ndp_degree = 2\n[strategy.sharding_configs]\nstage = 2\n')
    config = RunConfig.from_file(path, overrides={"strategy.hybrid_configs.mp_degree": 2})
    assert config.training.strategy["hybrid_configs"] == {"dp_degree": 2, "mp_degree": 2, "pp_degree": 1,
                                                          "sharding_degree": 1, "cp_degree": 1, "ep_degree": 1}
    assert config.training.strategy["sharding_configs"] == {"stage": 2}
    path.write_text('[model]\nname = "gpt-tiny"\n[training]\nstrategy = {}\n[strategy]\nrecompute = "full"\n')
    with pytest.raises(ValueError, match="both"):
        RunConfig.from_file(path)

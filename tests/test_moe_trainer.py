"""Mixture-of-Experts models in the Trainer (issue 38): the balancing figures logged after every
optimizer step (metrics.jsonl, the progress line, TensorBoard), the aux-loss-free bias moved once
per step, recompute (full, selective, and "moe": the MoE blocks only) equal to none in loss,
gradients and the blocks' statistics, and the loads summed over the data ranks before max / mean
(in one process through an injected reducer, and on dp2 x ep2 gloo ranks through fleet's). Cost:
about 15 s (the fleet case forks two ranks and saves a DCP checkpoint at the end).
"""

from __future__ import annotations

import copy
import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from ranks import run_ranks

from sampan.io import TokenWindowDataset
from sampan.models import create
from sampan.nn.moe import moe_blocks, moe_metrics, set_load_reducer
from sampan.nn.recompute import apply_recompute
from sampan.trainer import Trainer, TrainingArguments, moe_logging

SEQ = 16
VOCAB = 512
KEYS = ("moe/aux_loss", "moe/z_loss", "moe/dropped_tokens", "moe/load_max_over_mean")


def _model(name: str, z_loss: float = 0.0, **overrides):
    torch.manual_seed(0)
    model = create(name, **overrides)
    if z_loss:  # no family config names a z-loss: set it on the blocks
        for _, block in moe_blocks(model):
            block.config.z_loss_coef = z_loss
    return model


def _dataset(seed: int = 0) -> TokenWindowDataset:
    return TokenWindowDataset(np.random.default_rng(seed).integers(0, VOCAB, 40 * SEQ), seq_len=SEQ)


def _args(tmp_path: Path, **overrides) -> TrainingArguments:
    base = dict(output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4, learning_rate=3e-3,
                logging_steps=1, save_steps=0, progress_bar=False, peak_flops=0, seed=0, tensorboard=True)
    base.update(overrides)
    return TrainingArguments(**base)


def _records(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]


# -- the Trainer ------------------------------------------------------------------------------------------------
def test_trainer_logs_moe_balancing_everywhere_the_loss_goes(tmp_path, capsys):
    """Qwen3-MoE with the global-batch aux loss and a z-loss, two micro-batches a step and MoE-only
    recompute: every logged step carries finite balancing figures in metrics.jsonl, TensorBoard
    and the progress line, the loads of each step alone."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = _model("qwen3-moe-tiny", z_loss=1e-3, router_aux_loss_coef=0.01)
    layers = [f"moe/layer{i}/load_max_over_mean" for i in model.config.moe_layers()]
    trainer = Trainer(model, _args(tmp_path, gradient_accumulation_steps=2, recompute="moe"), _dataset())
    assert all("_sampan_recompute" in b.__dict__ for _, b in moe_blocks(trainer.model))
    trainer.train()
    assert all(b.aux_loss_scale == 0.5 for _, b in moe_blocks(trainer.model))  # one half per micro-batch
    run = tmp_path / "run"
    records = _records(run)
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        for key in (*KEYS, *layers):
            assert math.isfinite(record[key]), (record["step"], key)
        assert record["moe/aux_loss"] > 0.5 and record["moe/z_loss"] > 0 and record["moe/dropped_tokens"] == 0
        # One step's loads (2 micro-batches x 4 rows x 16 tokens x top-2 over 8 experts): at most all on one.
        assert 1.0 <= record["moe/load_max_over_mean"] <= 8.0
        assert record["moe/load_max_over_mean"] == max(record[k] for k in layers)
    # The statistics were reset after the last step: nothing is carried past it.
    assert all(float(b.tokens_per_expert.sum()) == 0 for _, b in moe_blocks(trainer.model))
    accumulator = EventAccumulator(str(run / "tensorboard"))
    accumulator.Reload()
    for key in (*KEYS, *layers):
        events = accumulator.Scalars(f"train/{key}")
        assert [e.step for e in events] == [1, 2, 3]
        assert [e.value for e in events] == pytest.approx([r[key] for r in records], rel=1e-6)
    printed = capsys.readouterr().out
    assert "aux " in printed and "load max/mean " in printed


def test_trainer_moves_the_aux_loss_free_bias_once_per_step(tmp_path):
    """DeepSeek-V3's correction bias moves by exactly one step of ``bias_update_rate`` per
    optimizer step (sign of mean load - load, loads reset after each step), so after 3 steps each
    entry is a multiple of the rate within 3 rates of 0, and the logged loads are finite."""
    model = _model("deepseek-v3-tiny")
    blocks = moe_blocks(model)
    assert blocks and all(b.gate.e_score_correction_bias is not None for _, b in blocks)
    before = [b.gate.e_score_correction_bias.clone() for _, b in blocks]
    Trainer(model, _args(tmp_path, tensorboard=False), _dataset()).train()
    for (_, block), start in zip(blocks, before, strict=True):
        rate = block.config.bias_update_rate
        steps = (block.gate.e_score_correction_bias - start) / rate
        assert steps.abs().max() > 0  # the bias moved
        assert torch.allclose(steps, steps.round(), atol=1e-3) and steps.abs().max() <= 3 + 1e-3
        # An expert above the mean load at every step went down all three times: someone did.
    assert any(float(((b.gate.e_score_correction_bias - s) / b.config.bias_update_rate).abs().max()) > 2.5
               for (_, b), s in zip(blocks, before, strict=True))
    record = _records(tmp_path / "run")[-1]
    assert all(math.isfinite(record[k]) for k in ("moe/aux_loss", "moe/load_max_over_mean"))
    assert {"moe/layer2/load_max_over_mean", "moe/layer3/load_max_over_mean"} <= set(record)


def test_loads_are_summed_through_the_load_reducer_before_max_over_mean():
    """Two data ranks whose loads mirror each other are even together: the logged ratio is the
    global batch's (1.0), not this rank's (2.4); the blocks keep their own loads afterwards."""
    model = _model("qwen3-moe-tiny")
    blocks = [b for _, b in moe_blocks(model)]
    mine = torch.tensor([6.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0])
    other = torch.tensor([0.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0])  # the other rank's, as DataRankSum adds it
    for block in blocks:
        block.tokens_per_expert.copy_(mine)
    assert moe_metrics(model)["moe/load_max_over_mean"] == pytest.approx(2.4)
    set_load_reducer(model, lambda t: t + other)
    metrics = moe_logging.step_metrics(model)
    assert metrics["moe/load_max_over_mean"] == pytest.approx(1.0)
    assert all(torch.equal(b.tokens_per_expert, mine) for b in blocks)


# -- recompute ---------------------------------------------------------------------------------------------------
def _step(model, ids):
    model.train()
    loss = model(ids, labels=ids)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    stats = [(b.tokens_per_expert.clone(), b.last_aux_loss) for _, b in moe_blocks(model)]
    return loss.detach(), grads, stats


@pytest.mark.parametrize("name, extra", [("qwen3-moe-tiny", {"router_aux_loss_coef": 0.01}),
                                         ("deepseek-v3-tiny", {})])
def test_recompute_full_selective_and_moe_equal_none(name, extra):
    """Loss and every gradient equal to 1e-6, and the blocks' statistics (tokens per expert, the
    aux loss) are those of one forward, not two: the replay inside backward does not count."""
    base = _model(name, z_loss=1e-3, **extra)
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
    want_loss, want_grads, want_stats = _step(copy.deepcopy(base), ids)
    for mode in ("full", "selective", "moe"):
        model = copy.deepcopy(base)
        wrapped = apply_recompute(model, mode)
        assert wrapped == (len(moe_blocks(model)) if mode == "moe" else model.config.num_layers)
        loss, grads, stats = _step(model, ids)
        assert float((loss - want_loss).abs()) <= 1e-6, mode
        assert grads.keys() == want_grads.keys()
        for key, grad in want_grads.items():
            assert float((grads[key] - grad).abs().max()) <= 1e-6, (mode, key)
        for (tokens, aux), (want_tokens, want_aux) in zip(stats, want_stats, strict=True):
            assert torch.equal(tokens, want_tokens), mode
            assert float(aux) == pytest.approx(float(want_aux), abs=1e-7)
            assert float(tokens.sum()) == 2 * SEQ * base.config.num_experts_per_tok


def test_moe_recompute_switches_with_the_other_modes_and_needs_moe_blocks():
    model = _model("qwen3-moe-tiny")
    layers = list(model.model.layers)
    assert apply_recompute(model, "moe") == 2
    assert apply_recompute(model, "full") == 4  # the MoE blocks are unwrapped: one kind at a time
    assert not any("_sampan_recompute" in b.__dict__ for _, b in moe_blocks(model))
    assert all("_sampan_recompute" in layer.__dict__ for layer in layers)
    assert apply_recompute(model, "moe") == 2
    assert not any("_sampan_recompute" in layer.__dict__ for layer in layers)
    assert apply_recompute(model, "none") == 0
    assert not any("_sampan_recompute" in m.__dict__ for m in model.modules())
    with pytest.raises(ValueError, match="has none .* use 'full' or 'selective'"):
        apply_recompute(create("llama-tiny"), "moe")
    assert TrainingArguments(recompute="moe").recompute == "moe"
    with pytest.raises(ValueError, match="recompute"):
        TrainingArguments(recompute="experts")


# -- fleet -------------------------------------------------------------------------------------------------------
FLEET_SCRIPT = textwrap.dedent('''
    import json, sys
    import numpy as np
    import torch
    import torch.distributed as dist
    from sampan.io import TokenWindowDataset
    from sampan.models import create
    from sampan.nn.moe import moe_blocks
    from sampan.trainer import Trainer, TrainingArguments, moe_logging

    out, layout = sys.argv[1], json.loads(sys.argv[2])
    torch.manual_seed(0)
    model = create("deepseek-v3-tiny")
    before = [b.gate.e_score_correction_bias.tolist() for _, b in moe_blocks(model)]
    data = TokenWindowDataset(np.random.default_rng(0).integers(0, 512, 40 * 16), seq_len=16)
    args = TrainingArguments(output_dir=out, max_steps=3, per_device_train_batch_size=2, learning_rate=3e-3,
                             logging_steps=1, save_steps=0, progress_bar=False, peak_flops=0, seed=0,
                             tensorboard=False, recompute="moe", strategy=layout)
    trainer = Trainer(model, args, data)
    trainer.train()
    blocks = [b for _, b in moe_blocks(trainer.model)]
    recomputed = all("_sampan_recompute" in b.__dict__ for b in blocks)
    # The real load reducer (fleet's DataRankSum): loads that mirror each other are even together.
    rank = dist.get_rank()
    mine = [6.0] + [2.0] * 7 if rank == 0 else [0.0] + [4.0] * 7
    for block in blocks:
        block.tokens_per_expert.copy_(torch.tensor(mine))
    ratio = moe_logging.step_metrics(trainer.model)["moe/load_max_over_mean"]
    after = [b.gate.e_score_correction_bias.tolist() for b in blocks]
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"before": before, "after": after, "ratio": ratio, "recomputed": recomputed}, f)
    from sampan.distributed.env import shutdown
    shutdown()
''')


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_fleet_trainer_reduces_the_loads_and_moves_the_bias_alike_on_every_rank(tmp_path):
    """dp2 x ep2 on two gloo ranks, MoE-only recompute around the expert-parallel all-to-all: rank 0
    logs finite balancing figures, the bias moves (once per step: it is fleet's forward_backward,
    not train_batch, that the Trainer runs) and equally on both ranks, and the logged loads are
    summed over the data ranks by the reducer fleet sets."""
    script = tmp_path / "fleet_moe.py"
    script.write_text(FLEET_SCRIPT)
    layout = {"hybrid_configs": {"dp_degree": 2, "ep_degree": 2}}
    run = run_ranks(script, [tmp_path, json.dumps(layout)], nproc=2, timeout=220)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert all(r["recomputed"] for r in ranks)
    assert ranks[0]["after"] == ranks[1]["after"] and ranks[0]["after"] != ranks[0]["before"]
    moved = torch.tensor(ranks[0]["after"]) - torch.tensor(ranks[0]["before"])
    steps = moved / 1e-3  # bias_update_rate
    assert torch.allclose(steps, steps.round(), atol=1e-3) and steps.abs().max() <= 3 + 1e-3
    assert ranks[0]["ratio"] == ranks[1]["ratio"] == pytest.approx(1.0)
    records = _records(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r[k]) for r in records for k in ("moe/aux_loss", "moe/load_max_over_mean"))

"""Expert parallelism (``hybrid_configs["ep_degree"]``) on real gloo ranks: every layout equals one process.

``tests/scripts/ep_equivalence.py`` trains a tiny MoE decoder (built from ``sampan.nn.MoE``: a
"global_batch" aux loss, a z-loss and the aux-loss-free correction bias, started skewed towards
expert 0) for 5 AdamW steps; the losses, the final parameters and biases must equal one process's
to 1e-5. The one-process reference runs the global batch as the same micro-batches the fleet run's
data ranks take together, so the loads the "global_batch" aux loss sums over the data ranks are
those of the same tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ranks import run_ranks

from sampan.distributed.comm_bench import OPS, bus_factor

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

SCRIPT = Path(__file__).parent / "scripts" / "ep_equivalence.py"
LAYERS, EXPERTS, TOP_K, HIDDEN, SEQ, BATCH = 4, 8, 2, 32, 16, 8  # as the script's model and batches
SKEW = 0.05


def _run(nproc: int, out: Path, *args: str, timeout: int = 300) -> dict:
    run = run_ranks(SCRIPT, [str(out), *args], nproc, timeout=timeout, distributed=nproc > 0)
    assert run.returncode == 0, run.stdout[-3000:]
    result = json.loads(out.read_text())
    result["state"] = torch.load(str(out) + ".pt")
    return result


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, dict]:
    """One process: the whole batch in one micro-batch, and as 2 micro-batches of 4 data shards
    (the pipeline case's); the first also saves a checkpoint after 3 steps. And the first with 6 experts."""
    tmp = tmp_path_factory.mktemp("ep-ref")
    return {"acc1": _run(0, tmp / "acc1.json"),
            "data4-acc2": _run(0, tmp / "acc2.json", "--data-ranks", "4", "--accumulate", "2"),
            "acc1-6experts": _run(0, tmp / "acc1e6.json", "--experts", "6")}


def _assert_equal(got: dict, want: dict, first: int = 0) -> None:
    losses, reference = got["losses"], want["losses"][first:]
    assert len(losses) == len(reference) == 5 - first
    for step, (g, w) in enumerate(zip(losses, reference, strict=True), start=first):
        assert abs(g - w) <= 1e-5 * abs(w), f"step {step}: {g} vs one process {w}"
    assert set(got["state"]) == set(want["state"])
    for name, value in want["state"].items():
        torch.testing.assert_close(got["state"][name], value, atol=1e-5, rtol=0, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.timeout(300)
def test_ep2_over_4_data_ranks_counts_its_all_to_alls_and_moves_the_bias_to_balance(reference, tmp_path):
    """ep2 x (expert-)dp2 on 4 ranks equals one process; each rank keeps 4 of the 8 experts; the
    all-to-alls of one step move what the closed form says; the correction bias is the same on every
    rank (the script checks) and moves towards balance; a checkpoint saved here resumes at ep4 on 4
    ranks and in one process (DCP reshards the [8, ...] expert tensors)."""
    ckpt = tmp_path / "dcp"
    got = _run(4, tmp_path / "ep2.json", "--dp", "4", "--ep", "2", "--comm", "--save-at", "3", "--ckpt", str(ckpt))
    _assert_equal(got, reference["acc1"])
    ranks = got["ranks"]
    assert all(r["experts_local_shape"] == [[EXPERTS // 2, 2 * 16, HIDDEN]] * LAYERS for r in ranks)

    # Per MoE layer and rank: the [E] int64 counts (forward), the token copies out and the results
    # back (forward), and both again in backward. A rank's copies depend on the routing; summed over
    # an ep group, the copies sent equal those received: every token of the group x top_k.
    group_tokens = 2 * (BATCH // 4) * SEQ
    per_layer = 2 * EXPERTS * 8 + 4 * group_tokens * TOP_K * HIDDEN * 4
    for group in ((0, 1), (2, 3)):  # ep groups are neighbouring data ranks
        a2a = [ranks[r]["comm"]["all_to_all"] for r in group]
        assert all(c["calls"] == 5 * LAYERS for c in a2a)
        assert sum(c["payload_bytes"] for c in a2a) == LAYERS * per_layer
        # CommCounter's ring estimate for all-to-all: the 1/ep of the buffer a rank keeps stays home.
        assert sum(c["wire_bytes"] for c in a2a) == LAYERS * per_layer * (2 - 1) / 2
    assert "all_to_all" in OPS and bus_factor("all_to_all", 4) == 0.75  # `sampan bench comm` times it too

    # Every token picked expert 0 at first (max / mean load = E / top_k = 4); the bias moved it away.
    assert got["imbalance"][0] == pytest.approx(EXPERTS / TOP_K, rel=0.25)
    assert got["imbalance"][-1] < 0.6 * got["imbalance"][0]
    for name, bias in got["state"].items():
        if name.endswith("e_score_correction_bias"):
            # Each update moves every bias by +-0.02 (the ranks' biases are equal: the script checks).
            start = torch.tensor([SKEW] + [0.0] * (EXPERTS - 1))
            steps = (bias - start) / 0.02
            assert torch.allclose(steps, steps.round(), atol=1e-3) and steps.abs().max() >= 1, (name, bias)

    for nproc, layout in ((4, ["--dp", "4", "--ep", "4"]), (0, [])):
        resumed = _run(nproc, tmp_path / f"resumed{nproc}.json", *layout, "--resume-from", str(ckpt))
        _assert_equal(resumed, reference["acc1"], first=3)


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("case", "args", "ref"), [
    ("ep2xdp2xpp2", ["--dp", "4", "--pp", "2", "--ep", "2", "--accumulate", "2"], "data4-acc2"),
    ("ep4xmp2", ["--dp", "4", "--mp", "2", "--ep", "4"], "acc1"),
    ("ep2-zero3-dp2xsharding4-recompute", ["--dp", "2", "--sharding", "4", "--ep", "2", "--stage", "3",
                                           "--recompute", "full", "--experts", "6"], "acc1-6experts"),
])
def test_8_rank_layouts_match_one_process(case, args, ref, reference, tmp_path):
    """Experts split over ep, the rest over pipeline stages (the expert loads of torch's shape-inference
    forward left out), tensor parallel ranks (MoE blocks whole on each) or ZeRO-3 (expert state
    sharded over the 4 expert-data ranks as (dp 2, sharding 4 / ep 2), with recompute replaying the
    all-to-alls in backward; 6 experts, so a rank's 3 do not split over its 2 shard ranks and FSDP2
    cuts the stacked weights along their second dimension, ``expert_shard_placement``)."""
    got = _run(8, tmp_path / f"{case}.json", *args, timeout=380)
    _assert_equal(got, reference[ref])
    if ref == "acc1-6experts":  # 3 experts a rank, [3, 2 x 16, 32] cut in half along the 32
        assert all(r["experts_local_shape"] == [[3, 16, HIDDEN]] * LAYERS for r in got["ranks"])

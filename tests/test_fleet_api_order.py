"""fleet's API in every order a user may call it, on real multi-process gloo groups.

The README builds the optimizer over ``fleet.distributed_model(...)``'s parameters; the docs build it
over the original model's before splitting; Paddle's documentation gives the strategy only to
``fleet.distributed_optimizer(optimizer, strategy=...)`` after a bare ``fleet.init(is_collective=True)``.
Each order must train the tiny GPT of ``tests/scripts/fleet_equivalence.py`` exactly as one process
does, and conflicting strategies must fail with an error that says what to do.

One torchrun per layout runs every order in turn (``tests/scripts/fleet_api_order.py``); the tests
read its report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ranks import run_ranks
from test_fleet import SCRIPT as EQUIVALENCE
from test_fleet import _assert_close

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

WORKER = Path(__file__).parent / "scripts" / "fleet_api_order.py"

ORDERS = ["before", "after", "seed"]
LAYOUTS = {  # name: (ranks, worker arguments)
    "pp2": (2, ["--pp", "2", "--accumulate", "2"]),
    "dp2xpp2": (4, ["--dp", "2", "--pp", "2", "--accumulate", "2"]),
    "dp2": (2, ["--dp", "2", "--orders", ",".join([*ORDERS, "seed-late"]), "--errors"]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[float]:
    """The tiny GPT's losses in one plain process (no fleet)."""
    path = tmp_path_factory.mktemp("ref") / "gpt.json"
    run = run_ranks(EQUIVALENCE, [str(path), "--family", "gpt"], timeout=120, distributed=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(path.read_text())["losses"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """``reports(layout)``: the worker's report for a layout, run once per module."""
    done: dict[str, dict] = {}

    def get(layout: str) -> dict:
        if layout not in done:
            nproc, args = LAYOUTS[layout]
            out = tmp_path_factory.mktemp(layout) / "report.json"
            run = run_ranks(WORKER, [str(out), *args], nproc, timeout=280)
            assert run.returncode == 0, run.stderr[-3000:]
            done[layout] = json.loads(out.read_text())
        return done[layout]

    return get


def _trained(report: dict, order: str, reference: list[float]) -> list[float]:
    """Check one order's run on every rank; returns its losses."""
    ranks = report["orders"][order]
    for rank, result in enumerate(ranks):
        assert "error" not in result, f"order {order!r}, rank {rank}: {result['error']}"
        assert result["bound"], f"order {order!r}, rank {rank}: the optimizer does not hold the distributed parameters"
        assert result["params"] > 0 and result["changed"] == result["params"], (
            f"order {order!r}, rank {rank}: training changed {result['changed']} of {result['params']} parameters")
        assert result["losses"] == ranks[0]["losses"], f"order {order!r}: ranks disagree on the loss"
    _assert_close(ranks[0]["losses"], reference)
    return ranks[0]["losses"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_optimizer_over_the_original_or_the_distributed_model_trains_alike(layout, reports, reference):
    """Bug: with pp_degree > 1 the README's order (the optimizer built over distributed_model's
    parameters) failed with "rebind_parameters() left the optimizer with no parameters"."""
    report = reports(layout)
    before = _trained(report, "before", reference)
    after = _trained(report, "after", reference)
    for step, (a, b) in enumerate(zip(before, after, strict=True)):
        assert abs(a - b) <= 1e-6 * abs(a), f"step {step}: optimizer built after distributed_model {b} vs before {a}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_strategy_given_only_to_distributed_optimizer_applies(layout, reports, reference):
    """Paddle's documented order: ``fleet.init(is_collective=True)``, then the strategy only in
    ``fleet.distributed_optimizer(optimizer, strategy=strategy)``; here before distributed_model."""
    report = reports(layout)
    seed = _trained(report, "seed", reference)
    before = report["orders"]["before"][0]["losses"]
    for step, (a, b) in enumerate(zip(before, seed, strict=True)):
        assert abs(a - b) <= 1e-6 * abs(a), f"step {step}: strategy given to distributed_optimizer {b} vs init {a}"


@pytest.mark.timeout(300)
def test_default_layout_strategy_after_distributed_model_applies(reports, reference):
    """``fleet.init()`` without a strategy is pure data parallel over every rank (Paddle's default);
    a strategy of that layout given to distributed_optimizer after distributed_model is accepted."""
    _trained(reports("dp2"), "seed-late", reference)


@pytest.mark.timeout(300)
def test_conflicting_strategies_fail_clearly(reports):
    errors = reports("dp2")["errors"]
    for rank, got in enumerate(errors):
        # init got dp2, distributed_optimizer pp2: refused, naming what differs in the two.
        msg = got["two_strategies"]
        assert msg.startswith("ValueError") and "fleet.init" in msg and "distributed_optimizer" in msg, (rank, msg)
        assert "dp_degree 2 vs 1" in msg and "pp_degree 1 vs 2" in msg, (rank, msg)
        # an equal strategy (another object) is the same strategy
        assert got["equal_strategies"] == "", (rank, got["equal_strategies"])
        # the model was already split under init's default layout (dp2): say to pass it to init
        for case in ("model_split_under_the_default", "topology_read_under_the_default"):
            msg = got[case]
            assert msg.startswith("ValueError") and "fleet.init(is_collective=True, strategy=" in msg, (rank, case, msg)
            assert "pp_degree 1 vs 2" in msg, (rank, case, msg)
        assert "distributed_model" in got["model_split_under_the_default"], rank

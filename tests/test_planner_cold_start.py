"""``sampan plan`` answers without importing torch (importing it costs 7-13 s on a loaded machine).

Behaviour, not timing: a fresh interpreter runs the plan verb and then reports whether ``torch``
(or anything of sampan that needs it) was imported. The torch-free pieces that stand in for
torch-importing ones (the zoo's shapes, the strategy's mode names) are checked against the real ones.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sampan.planner import layout as planner_layout
from sampan.planner.model_shape import _from_config, load_model
from sampan.planner.zoo import ZOO

PROBE = """
import contextlib, io, json, sys
from sampan.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
                  "printed": len(out.getvalue())}))
"""

PLAN_175B = ["plan", "--model", "gpt-175b", "--gpus", "1024", "--gpus-per-node", "8", "--gpu-memory-gb", "80",
             "--gpu-tflops", "312", "--intra-node-gbps", "600", "--inter-node-gbps", "200", "--seq-len", "2048",
             "--global-batch", "1536"]


def _probe(*argv: str) -> dict:
    run = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("extra", [[], ["--json", "--top", "3"],
                                   ["--fix", "mp=8,pp=8,sharding=16,micro_batch=1,recompute=full,vpp=2"]])
def test_plan_for_175b_does_not_import_torch(extra):
    result = _probe(*PLAN_175B, *extra)
    assert result["rc"] == 0 and result["printed"] > 500
    assert result["torch"] == [], f"the plan path imported {result['torch'][:5]}"


def test_an_inline_shape_does_not_import_torch():
    # (--write-strategy does: it builds the DistributedStrategy that `sampan train` will read, to validate it.)
    result = _probe("plan", "--model-shape", "layers=40,hidden=5120,heads=40,vocab=51200", "--gpus", "64",
                    "--global-batch", "256", "--top", "2")
    assert result["rc"] == 0 and result["torch"] == []


def test_the_other_verbs_still_parse():
    """The plan-only parser is a shortcut for `plan`; every other verb gets the full parser."""
    run = subprocess.run([sys.executable, "-m", "sampan.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0
    for verb in ("train", "report", "models", "launch", "plan", "bench", "demo"):
        assert verb in run.stdout


def test_zoo_shapes_equal_the_registry():
    from sampan.models import get_config, list_models

    assert sorted(ZOO) == list_models(), "sampan/planner/zoo.py must list every registered model"
    for name in list_models():
        assert ZOO[name] == _from_config(name, get_config(name)), name
        assert ZOO[name].num_parameters == get_config(name).num_parameters(), name
    assert load_model("gpt-175b") is ZOO["gpt-175b"]


def test_mode_names_equal_the_strategys():
    from sampan.distributed import strategy

    assert planner_layout.SCHEDULE_MODES == strategy.SCHEDULE_MODES
    assert planner_layout.RECOMPUTE_MODES == strategy.RECOMPUTE_MODES


def test_the_tensor_front_door_still_works():
    import sampan

    x = sampan.randn([2, 3])
    assert tuple(x.shape) == (2, 3) and sampan.no_grad is sampan.tensor.no_grad
    from sampan import arange, zeros

    assert arange(3).tolist() == [0, 1, 2] and zeros([1]).tolist() == [0.0]

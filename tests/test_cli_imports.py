"""Building ``sampan``'s parser imports no torch: ``sampan --help`` and the help of every verb whose
flags do not come from a config beside torch answer in about a second. (The plan verb's runs are
``tests/test_planner_cold_start.py``'s.) One fresh interpreter asks them all, then reports."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import contextlib, io, json, sys
from sampan.cli import build_parser, main
seen = {}
def torch():
    return sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
parser = build_parser()
parser.format_help()
seen["build_parser"] = torch()
for argv in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main(argv)
        except SystemExit as exit:
            assert exit.code == 0, (argv, exit.code)
    assert "usage: sampan" in out.getvalue(), argv
    seen[" ".join(argv)] = torch()
print(json.dumps(seen))
"""

TORCH_FREE_HELP = [["--help"], ["plan", "--help"], ["finetune", "--help"], ["train", "--help"], ["launch", "--help"],
                   ["bench", "comm", "--help"], ["hub", "build", "--help"], ["task", "--help"], ["serve", "--help"],
                   ["data", "fetch", "--help"], ["export", "--help"], ["models", "--help"], ["report", "--help"]]


def test_the_parser_and_the_help_import_no_torch():
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(TORCH_FREE_HELP)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(seen) == {"build_parser"} | {" ".join(argv) for argv in TORCH_FREE_HELP}
    assert {k: v[:3] for k, v in seen.items() if v} == {}, "these imported torch"


def test_a_verb_with_torch_side_flags_adds_them_when_it_runs():
    """The demo's flags come from DemoConfig, beside torch: there only once the verb is chosen."""
    probe = ("import sys; from sampan.cli import build_parser; p = build_parser(); "
             "print('torch' in sys.modules); a = p.parse_args(['demo', '--gpt.training.max_steps', '5']); "
             "print('torch' in sys.modules, getattr(a, 'gpt.training.max_steps'), getattr(a, 'gpt.training.output_dir'))")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["False", "True", "5", "outputs/demo"]

"""``sampan launch`` takes torchrun's ``--master_addr`` / ``--master_port`` (and their hyphen spellings).

To torchrun they name the master of the *static* rendezvous (its default backend): the node-rank-0
agent hosts a TCP store at MASTER_ADDR:MASTER_PORT and every worker sees those two values. They
are ignored once ``--rdzv_endpoint`` is given, and on one node with no port torchrun falls back to
a private rendezvous on a free port. The real run below uses 2 gloo ranks on 127.0.0.1 and carries a
timeout, so a hang fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sampan.cli import build_parser, main
from sampan.distributed.launch import LaunchConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "trainer_fleet.py"  # any existing file: these cases never run it
CLI = [sys.executable, "-m", "sampan.cli"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict[str, str]:
    drop = ("OMP_NUM_THREADS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "RANK", "WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "LOCAL_RANK")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PET_")}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_master_addr_and_port_reach_a_real_two_rank_gloo_group(tmp_path):
    port = _free_port()
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os, sys\n"
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "x = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(x)\n"
        "keys = ['RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', 'GROUP_RANK']\n"
        "out = {k: os.environ.get(k) for k in keys}\n"
        "out['sum'] = x.item()\n"
        "open(os.path.join(sys.argv[1], 'rank%d.json' % dist.get_rank()), 'w').write(json.dumps(out))\n"
        "dist.destroy_process_group()\n")
    run = subprocess.run([*CLI, "launch", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                          "--master_port", str(port), str(script), str(tmp_path)],
                         capture_output=True, text=True, env=_env(), timeout=170)
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "GROUP_RANK": "0", "sum": 3.0}


@pytest.mark.parametrize("spelling", [("--master_addr", "--master_port"), ("--master-addr", "--master-port")])
def test_both_spellings_parse(spelling):
    addr, port = spelling
    args = build_parser().parse_args(["launch", "--nnodes", "2", "--node-rank", "1", addr, "10.0.0.1",
                                      port, "29511", str(SCRIPT), "--master_port", "7"])
    assert (args.master_addr, args.master_port, args.node_rank) == ("10.0.0.1", 29511, 1)
    assert args.script_args == ["--master_port", "7"]  # after SCRIPT: the script's, untouched


def _argv(**fields) -> list[str]:
    return LaunchConfig(script=str(SCRIPT), nproc_per_node=2, **fields).validate().torchrun_argv()


def test_master_flags_select_torchruns_static_rendezvous():
    # One node, a port: static rendezvous at MASTER_ADDR:PORT, this node rank 0 (torchrun's defaults).
    argv = _argv(master_addr="127.0.0.1", master_port=29511)
    assert "--standalone" not in argv
    assert {"--nnodes=1", "--rdzv_backend=static", "--node_rank=0", "--master_addr=127.0.0.1",
            "--master_port=29511"} <= set(argv)
    assert not any(a.startswith("--rdzv_endpoint") for a in argv)
    # The port alone: the address is torchrun's default, 127.0.0.1.
    assert {"--master_addr=127.0.0.1", "--master_port=29600"} <= set(_argv(master_port=29600))
    # Several nodes: the master's address stands in for --rdzv_endpoint; the port defaults to 29500.
    argv = _argv(nnodes="2", node_rank=1, master_addr="10.0.0.1")
    assert {"--nnodes=2", "--rdzv_backend=static", "--node_rank=1", "--master_addr=10.0.0.1",
            "--master_port=29500"} <= set(argv)
    # Only an address on one node: torchrun falls back to a private rendezvous on a free port.
    assert "--standalone" in _argv(master_addr="127.0.0.1")


@pytest.mark.parametrize(("argv", "message"), [
    (["--master_port", "0"], "--master_port must be in [1, 65535]"),
    (["--master_port", "70000"], "--master_port must be in [1, 65535]"),
    (["--master_addr", "10.0.0.1", "--rdzv_endpoint", "10.0.0.1:29400"], "give the rendezvous once"),
    (["--master_port", "29511", "--standalone"], "--standalone is for one node"),
    (["--master_port", "29511", "--max_restarts", "1"], "cannot restart"),
    (["--nnodes", "2", "--node_rank", "1", "--master_port", "29511"], "needs --master_addr"),
    (["--nnodes", "2", "--master_addr", "10.0.0.1"], "needs this node's --node_rank"),
    (["--nnodes", "1:2", "--node_rank", "0", "--master_addr", "10.0.0.1"], "fixed --nnodes"),
])
def test_master_flags_bad_combinations_are_clear_errors(argv, message, capsys):
    assert main(["launch", *argv, str(SCRIPT)]) == 2
    assert message in capsys.readouterr().err


def test_help_lists_the_master_flags(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["launch", "--help"])
    text = capsys.readouterr().out
    assert "--master_addr" in text and "--master-port" in text

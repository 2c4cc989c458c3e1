"""``sampan launch`` (torchrun front: defaults, errors, elastic restart) and ``sampan bench comm``.

Multi-process cases use 2 gloo ranks with OMP_NUM_THREADS=1 and carry a timeout, so a hang fails.
The elastic restart (a SIGKILLed rank of 4) is tested with the Trainer in tests/test_trainer_fleet.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sampan.cli import main
from sampan.distributed.comm_bench import OPS, bus_factor, parse_size, parse_sizes, print_table
from sampan.distributed.launch import LaunchConfig, elastic_env

ROOT = Path(__file__).resolve().parents[1]
ELASTIC = ROOT / "tests" / "scripts" / "trainer_fleet.py"  # elastic restart: tests/test_trainer_fleet.py
CLI = [sys.executable, "-m", "sampan.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "RANK", "WORLD_SIZE")}
    return {**env, **extra}


def test_launch_help_lists_every_option():
    out = subprocess.run([*CLI, "launch", "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    for flag in ("--nproc_per_node", "--nnodes", "--node_rank", "--rdzv_endpoint", "--rdzv_id", "--max_restarts",
                 "--standalone", "--log_dir", "--module", "script", "ARGS"):
        assert flag in out, flag
    bench = subprocess.run([*CLI, "bench", "comm", "--help"], capture_output=True, text=True, timeout=60,
                           check=True).stdout
    for flag in ("--sizes", "--iters", "--ops", "--json", "--nproc", "2(n-1)/n"):
        assert flag in bench, flag


@pytest.mark.parametrize(("argv", "message"), [
    (["--nproc_per_node", "0"], "--nproc_per_node must be a positive"),
    (["--nproc_per_node", "-2"], "--nproc_per_node must be a positive"),
    (["--nproc_per_node", "two"], "must be a positive integer or one of"),
    (["--nnodes", "2"], "needs --rdzv_endpoint"),
    (["--nnodes", "0"], "--nnodes '0' must be"),
    (["--max_restarts", "-1"], "--max_restarts must be >= 0"),
    (["--nnodes", "2", "--rdzv_endpoint", "node0"], "must be HOST:PORT"),
    (["--nnodes", "2", "--rdzv_endpoint", "h:1", "--node_rank", "0", "--max_restarts", "1"],
     "cannot restart"),
    (["--standalone", "--nnodes", "2", "--rdzv_endpoint", "h:1"], "--standalone is for one node"),
])
def test_bad_launch_input_is_a_clear_error(argv, message, capsys):
    assert main(["launch", *argv, str(ELASTIC)]) == 2
    assert message in capsys.readouterr().err


def test_missing_script_is_a_clear_error(tmp_path, capsys):
    assert main(["launch", "--nproc_per_node", "2", str(tmp_path / "nope.py")]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "nope.py" in err
    assert main(["launch", "-m", "no_such_module_xyz"]) == 2
    assert "not importable" in capsys.readouterr().err


def test_torchrun_arguments_and_environment():
    one = LaunchConfig(script=str(ELASTIC), script_args=["--steps", "3"], nproc_per_node=2).validate()
    assert one.torchrun_argv() == ["--nproc_per_node=2", "--max_restarts=0", "--standalone", str(ELASTIC),
                                   "--steps", "3"]
    multi = LaunchConfig(script=str(ELASTIC), nproc_per_node=8, nnodes="2:4", rdzv_endpoint="node0:29400",
                         rdzv_id="job7", max_restarts=3).validate()
    argv = multi.torchrun_argv()
    assert "--standalone" not in argv
    assert {"--nnodes=2:4", "--rdzv_backend=c10d", "--rdzv_endpoint=node0:29400", "--rdzv_id=job7"} <= set(argv)
    static = LaunchConfig(script=str(ELASTIC), nnodes="2", node_rank=1, rdzv_endpoint="10.0.0.1:29500").validate()
    assert {"--rdzv_backend=static", "--node_rank=1", "--master_addr=10.0.0.1",
            "--master_port=29500"} <= set(static.torchrun_argv())
    # Defaults only fill what the user left unset; the store fix only when restarts are asked for.
    add, notes = elastic_env(multi, {})
    assert add == {"OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} and len(notes) == 1
    add, notes = elastic_env(one, {"OMP_NUM_THREADS": "4"})
    assert add == {} and notes == []
    assert elastic_env(multi, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0", "OMP_NUM_THREADS": "2"})[0] == {}


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_launch_passes_script_args_and_sets_thread_default(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("import json, os, sys\n"
                      "keys = ['RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'OMP_NUM_THREADS']\n"
                      "out = {k: os.environ.get(k) for k in keys}\n"
                      "out['argv'] = sys.argv[1:]\n"
                      "open(os.path.join(sys.argv[1], 'rank%s.json' % os.environ['RANK']), 'w').write(json.dumps(out))\n")
    run = subprocess.run([*CLI, "launch", "--nproc_per_node", "2", str(script), str(tmp_path), "--lr", "3e-4",
                          "--nproc_per_node", "7"], capture_output=True, text=True, env=_env(), timeout=170)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("OMP_NUM_THREADS is not set") == 1  # warned once, by the launcher
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1",
                       "argv": [str(tmp_path), "--lr", "3e-4", "--nproc_per_node", "7"]}


def test_multi_node_addresses_come_from_the_route_to_the_endpoint():
    from sampan.distributed.launch import interface_of, is_local_address, route_address

    assert route_address("127.0.0.1", 29400) == "127.0.0.1"
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("203.0.113.9") is None  # TEST-NET-3: on no interface here
    assert is_local_address("127.0.0.1") and not is_local_address("203.0.113.9")
    config = LaunchConfig(script=str(ELASTIC), nproc_per_node=2, nnodes="2", rdzv_endpoint="127.0.0.1:29400")
    argv = config.validate().torchrun_argv()
    assert "--local_addr=127.0.0.1" in argv and "--rdzv_conf=is_host=1" in argv
    pinned = LaunchConfig(script=str(ELASTIC), nnodes="2", rdzv_endpoint="127.0.0.1:29400", local_addr="10.0.0.7")
    assert "--local_addr=10.0.0.7" in pinned.torchrun_argv()
    # Loopback is never forced on gloo: that would cut a real multi-node job off from the others.
    add, _ = elastic_env(config, {})
    assert "GLOO_SOCKET_IFNAME" not in add


def test_sizes_and_bus_factors():
    assert parse_sizes("1KB,64KB,1MB,16MB") == [1024, 65536, 1 << 20, 16 << 20]
    assert parse_size("512") == 512 and parse_size("2GB") == 2 << 30 and parse_size("1.5K") == 1536
    for bad in ("", "1XB", "-1KB", "0"):
        with pytest.raises(ValueError, match="message size"):
            parse_size(bad)
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == 0.75
    assert bus_factor("send_recv", 8) == 1.0
    assert main(["bench", "comm", "--ops", "all_reduce,broadcast"]) == 2
    assert main(["bench", "comm", "--iters", "0"]) == 2


def _check_report(report: dict, sizes: list[int], world_size: int) -> None:
    assert report["world_size"] == world_size and report["backend"] == "gloo"
    rows = report["results"]
    assert {(r["op"], r["bytes"]) for r in rows} == {(op, s) for op in OPS for s in sizes}
    for row in rows:
        assert row["time_us"] > 0 and row["algbw_GBps"] > 0 and row["busbw_GBps"] > 0
        factor = bus_factor(row["op"], world_size)
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factor)
        assert row["algbw_GBps"] == pytest.approx(row["bytes"] / (row["time_us"] * 1e-6) / 1e9)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_bench_comm_spawns_its_own_group(capsys):
    run = subprocess.run([*CLI, "bench", "comm", "--sizes", "1KB,64KB", "--iters", "3", "--json"],
                         capture_output=True, text=True, env=_env(), timeout=170)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout)
    _check_report(report, [1024, 65536], 2)
    print_table(report)
    table = capsys.readouterr().out
    for op in OPS:
        assert op in table
    assert "busbw" in table and "64KB" in table


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_bench_comm_under_the_launcher_uses_its_group():
    run = subprocess.run([*CLI, "launch", "--nproc_per_node", "2", "-m", "sampan.cli", "bench", "comm",
                          "--sizes", "4KB", "--iters", "2", "--json"],
                         capture_output=True, text=True, env=_env(), timeout=170)
    assert run.returncode == 0, run.stderr[-3000:]
    _check_report(json.loads(run.stdout), [4096], 2)  # only rank 0 prints

"""Run a test script on N real gloo ranks without paying each rank's start-up: ``run_ranks``.

A multi-rank test's cost was mostly start-up: torchrun's agent, and every rank importing torch
and sampan (a 4-rank fleet case took 8.2 s through torchrun, 2.3 s this way, with the same losses
to the last bit). A *zygote* process imports them once and forks the ranks of each case from
itself: every rank is still its own process, in its own gloo group with a TCP store, set up from
the same ``RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` / ``MASTER_PORT`` environment torchrun gives,
and a TCPStore hosted apart from the ranks as torchrun's agent hosts it (a rank that fails first
cannot take the store away from ranks still joining). The zygote itself never runs a torch op (so
forking it is safe) and one serves a whole pytest session (each xdist worker has its own). torchrun itself stays tested where it is the subject
(test_launch, test_trainer_resume, test_multinode, test_trainer_fleet, and one fleet case run
both ways in test_fleet). ``SAMPAN_TEST_TORCHRUN=1`` sends every case through torchrun instead.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

TORCHRUN = os.environ.get("SAMPAN_TEST_TORCHRUN", "") not in ("", "0")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# The zygote: imports once, then forks the ranks of each request read from stdin (one JSON line),
# waits for them up to the request's timeout (then kills them) and answers one JSON line.
ZYGOTE = r'''
import json, os, runpy, signal, sys, time
import torch, torch.distributed  # noqa: F401 - imported once, inherited by every forked rank
import sampan.distributed.fleet, sampan.models, sampan.trainer.trainer  # noqa: F401

def store_process(world_size):
    """Fork the case's TCPStore server (as torchrun's agent hosts it, so a rank that fails first
    cannot take the store from ranks still joining): returns (its pid, its port)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        store = torch.distributed.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False)
        os.write(write, str(store.port).encode())
        os.close(write)
        while True:
            signal.pause()
    os.close(write)
    port = int(os.read(read, 16).decode())
    os.close(read)
    return pid, port

def rank_main(req, rank, port):
    if req["distributed"]:
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(req["nproc"]), "LOCAL_RANK": str(rank),
                           "LOCAL_WORLD_SIZE": str(req["nproc"]), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True",
                           "TORCHELASTIC_RESTART_COUNT": "0"})
    os.environ.update(req["env"])
    log = os.open(f"{req['log']}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0); os.dup2(log, 1); os.dup2(log, 2)
    sys.argv = [req["script"], *req["argv"]]
    sys.path.insert(0, os.path.dirname(os.path.abspath(req["script"])))  # as `python script.py` does
    code = 0
    try:
        runpy.run_path(req["script"], run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        import traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(code)

for line in sys.stdin:
    req = json.loads(line)
    store, port = store_process(req["nproc"]) if req["distributed"] else (None, 0)
    pids = []
    for rank in range(req["nproc"]):
        pid = os.fork()
        if pid == 0:
            rank_main(req, rank, port)
        pids.append(pid)
    codes, deadline, timed_out = {}, time.monotonic() + req["timeout"], False
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if len(codes) < len(pids):
            if time.monotonic() > deadline:
                timed_out = True
                for pid in pids:
                    if pid not in codes:
                        os.kill(pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.02)
    if store is not None:
        os.kill(store, signal.SIGKILL)
        os.waitpid(store, 0)
    print(json.dumps({"codes": [codes[p] for p in pids], "timed_out": timed_out}), flush=True)
'''


class _Zygote:
    """One zygote process for this pytest process, started on first use, stopped at exit."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def ask(self, request: dict) -> dict:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True, env=ENV)
                atexit.register(self.close)
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline()
            if not answer:
                raise RuntimeError(f"the rank zygote died (exit {self.proc.wait()})")
            return json.loads(answer)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


_ZYGOTE = _Zygote()


def run_ranks(script: str | Path, args: Sequence[str] = (), nproc: int = 2, timeout: float = 240,
              env: Mapping[str, str] | None = None, distributed: bool = True) -> subprocess.CompletedProcess:
    """``script`` on ``nproc`` ranks, as torchrun would run it; ``distributed=False`` runs it as one
    plain process (no launcher environment). Returns what ``subprocess.run`` would: the exit code
    (the worst rank's; -9 after ``timeout``) and the ranks' output, each line prefixed
    ``[rankN]:`` as torchrun prefixes a failing rank's lines."""
    args = [str(a) for a in args]
    if TORCHRUN:
        cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
               if distributed else [sys.executable]) + [str(script), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env={**ENV, **(env or {})}, timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="sampan-ranks-") as tmp:
        log = str(Path(tmp) / "rank")
        answer = _ZYGOTE.ask({"script": str(script), "argv": args, "nproc": nproc if distributed else 1,
                              "timeout": timeout, "env": dict(env or {}), "log": log, "distributed": distributed})
        lines = []
        for rank in range(nproc if distributed else 1):
            text = Path(f"{log}.{rank}").read_text(encoding="utf-8", errors="replace")
            lines += [f"[rank{rank}]: {line}" if distributed else line for line in text.splitlines()]
    codes = answer["codes"]
    if answer["timed_out"]:
        raise subprocess.TimeoutExpired([str(script), *args], timeout, output="\n".join(lines))
    worst = next((c for c in codes if c != 0), 0)
    output = "\n".join(lines) + ("\n" if lines else "")
    return subprocess.CompletedProcess([str(script), *args], worst, output, output)

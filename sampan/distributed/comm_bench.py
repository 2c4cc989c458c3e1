"""``sampan bench comm``: nccl-tests-style bandwidth of collectives, by message size.

    sampan bench comm                                     # spawns 2 local gloo ranks
    sampan bench comm --sizes 1KB,1MB --ops all_reduce --json
    sampan launch --nproc_per_node 8 -m sampan.cli bench comm    # in the launcher's group (NCCL on GPUs)

For each op and message size it reports the median time of one call, the algorithm bandwidth
``algbw = size / time`` and the bus bandwidth ``busbw = algbw * factor``, with the factors of
nccl-tests (``doc/PERFORMANCE.md`` there): all_reduce ``2(n-1)/n``, all_gather and reduce_scatter
``(n-1)/n``, all_to_all ``(n-1)/n`` (the share a rank keeps for itself never leaves it), send_recv
``1``. Bus bandwidth is what each link carried, so it can be compared
across rank counts and against the hardware's link speed.

As in nccl-tests, ``size`` is the whole buffer: all_reduce's buffer, all_gather's output (each rank
gives ``size / n``), reduce_scatter's input (each rank keeps ``size / n``), all_to_all's input (each rank sends
``size / n`` to every rank, expert parallelism's token dispatch), and the bytes each rank
sends in send_recv (rank r sends to r+1 and receives from r-1 at the same time). Sizes are rounded
down to a multiple of ``n`` elements, which is what the table shows.

Timing: before every timed call the ranks meet at a barrier; each rank times its call (with a
device sync on GPU), the per-call time is the slowest rank's, and the reported time is the median
over ``iters`` calls. Run alone, it spawns ``nproc`` ranks on this machine with gloo; under a
launcher it uses the launcher's group (NCCL on GPUs).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
DTYPES = ("float32", "bfloat16", "float16")
_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2, "MIB": 1024**2,
          "G": 1024**3, "GB": 1024**3, "GIB": 1024**3}


def parse_size(text: str) -> int:
    """``"64KB"`` -> 65536 bytes. Units B, KB, MB, GB (also K / KiB ...) are powers of 1024, as in nccl-tests."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"message size {text!r} must be a number with an optional unit B, KB, MB or GB (e.g. 64KB)")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"message size {text!r} must be positive")
    return size


def parse_sizes(text: str) -> list[int]:
    """``"1KB,64KB,1MB"`` -> sizes in bytes, in the order given."""
    sizes = [parse_size(part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise ValueError("--sizes is empty: give e.g. 1KB,64KB,1MB")
    return sizes


def parse_list(text: str) -> list[str] | None:
    """``"all_reduce,send_recv"`` -> the op names; ``"all"`` -> None (every op)."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == ["all"]:
        return None
    return names


def format_size(nbytes: int) -> str:
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes}B"


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' bus-bandwidth factor: bytes each link carries per byte of the message."""
    n = world_size
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "send_recv":
        return 1.0
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def check_request(sizes: Sequence[int], ops: Sequence[str] | None, iters: int, warmup: int, dtype: str) -> list[str]:
    ops = list(OPS) if ops is None else list(ops)
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise ValueError(f"unknown op(s) {unknown or ops}; choose from {', '.join(OPS)} (or all)")
    if iters < 1:
        raise ValueError(f"--iters must be >= 1, got {iters}")
    if warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {warmup}")
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"sizes must be positive byte counts, got {list(sizes)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    return ops


def _collective(op: str, size: int, dtype, device, rank: int, n: int) -> tuple[Callable[[], None], int]:
    """A no-argument call that runs ``op`` once on fresh buffers, and the message size in bytes it moves."""
    import torch
    import torch.distributed as dist

    elem = torch.empty((), dtype=dtype).element_size()
    count = max(n, size // elem // n * n)  # a multiple of n elements, so every rank's share is equal
    nbytes = count * elem
    # torch 2.13 deprecates all_gather_into_tensor / reduce_scatter_tensor (FutureWarning) in favour
    # of the *_single names; torch 2.11 (still supported) has only the old ones.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if op == "all_reduce":
        buf = torch.ones(count, dtype=dtype, device=device)
        return (lambda: dist.all_reduce(buf)), nbytes
    if op == "all_gather":
        out = torch.empty(count, dtype=dtype, device=device)
        inp = torch.ones(count // n, dtype=dtype, device=device)
        return (lambda: all_gather(out, inp)), nbytes
    if op == "reduce_scatter":
        out = torch.empty(count // n, dtype=dtype, device=device)
        inp = torch.ones(count, dtype=dtype, device=device)
        return (lambda: reduce_scatter(out, inp)), nbytes
    if op == "all_to_all":
        out = torch.empty(count, dtype=dtype, device=device)
        inp = torch.ones(count, dtype=dtype, device=device)
        return (lambda: dist.all_to_all_single(out, inp)), nbytes
    if op == "send_recv":
        send = torch.ones(count, dtype=dtype, device=device)
        recv = torch.empty(count, dtype=dtype, device=device)
        dst, src = (rank + 1) % n, (rank - 1) % n

        def send_recv() -> None:
            # Both directions at once (a ring), as nccl-tests' sendrecv does.
            requests = [dist.isend(send, dst), dist.irecv(recv, src)]
            for request in requests:
                request.wait()

        return send_recv, nbytes
    raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")


def bench_in_group(sizes: Sequence[int], ops: Sequence[str] | None = None, iters: int = 20, warmup: int = 3,
                   dtype: str = "float32") -> list[dict[str, Any]]:
    """Time ``ops`` x ``sizes`` in the current process group. Collective: every rank calls it, all get the rows."""
    import torch
    import torch.distributed as dist

    ops = check_request(sizes, ops, iters, warmup, dtype)
    n, rank = dist.get_world_size(), dist.get_rank()
    if n < 2:
        raise ValueError("a communication benchmark needs at least 2 ranks; run it under "
                         "`sampan launch --nproc_per_node N` or alone with --nproc >= 2")
    backend = dist.get_backend()
    on_gpu = backend == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    torch_dtype = getattr(torch, dtype)
    rows = []
    for op in ops:
        for size in sizes:
            call, nbytes = _collective(op, size, torch_dtype, device, rank, n)
            for _ in range(warmup):
                call()
            sync()
            times = torch.empty(iters, dtype=torch.float64)
            for i in range(iters):
                dist.barrier()
                start = time.perf_counter()
                call()
                sync()
                times[i] = time.perf_counter() - start
            # A call ends when its slowest rank is done with it.
            times = times.to(device)
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
            seconds = statistics.median(times.cpu().tolist())
            algbw = nbytes / seconds / 1e9
            rows.append({"op": op, "bytes": nbytes, "size": format_size(nbytes), "time_us": seconds * 1e6,
                         "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor(op, n)})
    return rows


def _report(rows: list[dict[str, Any]], world_size: int, backend: str, dtype: str, iters: int) -> dict[str, Any]:
    return {"world_size": world_size, "backend": backend, "dtype": dtype, "iters": iters,
            "bandwidth_unit": "GB/s (1e9 bytes per second)", "results": rows}


def _spawned_rank(rank: int, nproc: int, port: int, out: str, sizes, ops, iters, warmup, dtype) -> None:
    """One spawned rank: join the parent's store, benchmark, rank 0 writes the rows to ``out``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=nproc, timeout=timedelta(seconds=120))
    rows = bench_in_group(sizes, ops, iters, warmup, dtype)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()
    # gloo groups sometimes abort in interpreter teardown after all work is done
    # ("terminate called without an active exception"); leaving at once avoids it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn_comm_bench(sizes: Sequence[int], ops: Sequence[str] | None = None, iters: int = 20, warmup: int = 3,
                     nproc: int = 2, dtype: str = "float32") -> dict[str, Any]:
    """Spawn ``nproc`` local gloo ranks, benchmark, and return the report (rows for every op and size)."""
    import torch.distributed as dist
    import torch.multiprocessing as mp

    ops = check_request(sizes, ops, iters, warmup, dtype)
    if nproc < 2:
        raise ValueError(f"--nproc must be >= 2 (a collective needs two ranks), got {nproc}")
    # The parent holds the rendezvous store on a port the OS picks, so there is no free-port race.
    store = dist.TCPStore("127.0.0.1", 0, world_size=nproc + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    old_omp = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # spawned children inherit it before torch starts
    try:
        with tempfile.TemporaryDirectory(prefix="sampan-bench-") as tmp:
            out = os.path.join(tmp, "rows.json")
            mp.start_processes(_spawned_rank, args=(nproc, store.port, out, list(sizes), ops, iters, warmup, dtype),
                               nprocs=nproc, join=True, start_method="spawn")
            with open(out) as f:
                rows = json.load(f)
    finally:
        if old_omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        del store
    return _report(rows, nproc, "gloo", dtype, iters)


def run_comm_bench(sizes: Sequence[int], ops: Sequence[str] | None = None, iters: int = 20, warmup: int = 3,
                   nproc: int = 2, backend: str = "auto", dtype: str = "float32") -> dict[str, Any] | None:
    """``sampan bench comm``: in the launcher's group if there is one (the report on rank 0, None on
    the others), else in ``nproc`` spawned local gloo ranks."""
    from sampan.distributed import env

    if backend not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend {backend!r}: choose auto, gloo or nccl")
    if not env.launched():
        if backend == "nccl":
            raise ValueError("--backend nccl needs a launcher: sampan launch --nproc_per_node N ... "
                             "(spawned ranks use gloo)")
        return spawn_comm_bench(sizes, ops, iters, warmup, nproc, dtype)

    import torch
    import torch.distributed as dist

    check_request(sizes, ops, iters, warmup, dtype)
    owned = not dist.is_initialized()
    if owned:
        if backend == "auto":
            env.init_process_group(timeout_s=120)
        else:
            if backend == "nccl":
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=120))
    rows = bench_in_group(sizes, ops, iters, warmup, dtype)
    report = _report(rows, dist.get_world_size(), dist.get_backend(), dtype, iters)
    rank = dist.get_rank()
    if owned:
        dist.destroy_process_group()
    return report if rank == 0 else None


def _gbps(value: float) -> str:
    return f"{value:.3f}" if value >= 0.1 else f"{value:.2g}"


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"collectives on {report['world_size']} ranks ({report['backend']}, {report['dtype']}, "
                        f"median of {report['iters']}); bandwidth in GB/s")
    for col in ("op", "size", "time (us)", "algbw", "busbw"):
        table.add_column(col, justify="left" if col == "op" else "right")
    for row in report["results"]:
        table.add_row(row["op"], row["size"], f"{row['time_us']:,.1f}", _gbps(row["algbw_GBps"]),
                      _gbps(row["busbw_GBps"]))
    Console().print(table)

"""``sampan bench comm``: collective bandwidth by message size (``sampan.distributed.comm_bench``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Literal

from sampan.commands import set_handler
from sampan.utils.config import nested, resolve_nested
from sampan.utils.output import Output


@dataclasses.dataclass
class CommBenchOptions:
    """Which collectives, at which sizes, on how many ranks.

    Fields:
        sizes: message sizes, B / KB / MB / GB (powers of 1024).
        ops: collectives to time, or all: all_reduce, all_gather, reduce_scatter, all_to_all, send_recv.
        iters: timed iterations per op and size.
        warmup: untimed iterations first.
        nproc: ranks to spawn when not under a launcher.
        backend: auto: the launcher's group, or gloo for spawned ranks.
        device: auto, cpu (gloo) or cuda / cuda:N (NCCL; under a launcher each rank takes its
            LOCAL_RANK GPU); auto: as --backend says.
        dtype: element type of the buffers.
        output: how the table is printed.
    """

    sizes: tuple[str, ...] = ("1KB", "64KB", "1MB", "16MB")
    ops: tuple[str, ...] = ("all",)
    iters: int = 20
    warmup: int = 3
    nproc: int = 2
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    device: str = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    output: Output = nested(Output, flatten=True)

    def __post_init__(self) -> None:
        resolve_nested(self)


def run_comm(args: argparse.Namespace) -> int:
    from sampan.distributed.comm_bench import parse_list, parse_sizes, print_table, run_comm_bench
    from sampan.utils.device import resolve_device
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(CommBenchOptions, args)
    backend = options.backend
    if options.device != "auto":
        # A device picks the backend (cuda: NCCL, cpu: gloo); asking for CUDA where there is none
        # fails here, in one line, before any process starts.
        kind = resolve_device(options.device).type
        wanted = "nccl" if kind == "cuda" else "gloo"
        if backend not in ("auto", wanted):
            raise ValueError(f"--device {options.device} runs on {wanted}, but --backend {backend} was asked for; "
                             "drop one of them")
        backend = wanted
    report = run_comm_bench(sizes=parse_sizes(",".join(options.sizes)), ops=parse_list(",".join(options.ops)),
                            iters=options.iters, warmup=options.warmup, nproc=options.nproc, backend=backend,
                            dtype=options.dtype)
    if report is None:  # a launched rank other than 0: rank 0 reports
        return 0
    if options.output.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks of this machine (bench comm: collective bandwidth)",
                                  description="Measure this machine. `sampan bench comm` times collectives.")
    benches = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    comm = benches.add_parser(
        "comm", help="bus bandwidth of all_reduce / all_gather / reduce_scatter / all_to_all / send_recv by message size",
        description="nccl-tests-style collective benchmark: median time per op and message size, algorithm "
                    "bandwidth (size / time) and bus bandwidth (algbw x 2(n-1)/n for all_reduce, (n-1)/n for "
                    "all_gather, reduce_scatter and all_to_all, 1 for send_recv). Under a launcher (sampan launch / torchrun) "
                    "it uses that group; run alone it spawns --nproc local gloo ranks.")
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(comm, CommBenchOptions, metavars={"sizes": "SIZE[,SIZE...]", "ops": "OP[,OP...]"})
    set_handler(comm, run_comm)

"""``sampan bench comm``: collective bandwidth by message size (``sampan.distributed.comm_bench``)."""

from __future__ import annotations

import argparse
import json

from sampan.commands import set_handler


def run_comm(args: argparse.Namespace) -> int:
    from sampan.distributed.comm_bench import parse_list, parse_sizes, print_table, run_comm_bench
    from sampan.utils.device import resolve_device

    backend = args.backend
    if args.device != "auto":
        # A device picks the backend (cuda: NCCL, cpu: gloo); asking for CUDA where there is none
        # fails here, in one line, before any process starts.
        kind = resolve_device(args.device).type
        wanted = "nccl" if kind == "cuda" else "gloo"
        if backend not in ("auto", wanted):
            raise ValueError(f"--device {args.device} runs on {wanted}, but --backend {backend} was asked for; "
                             "drop one of them")
        backend = wanted
    report = run_comm_bench(sizes=parse_sizes(args.sizes), ops=parse_list(args.ops), iters=args.iters,
                            warmup=args.warmup, nproc=args.nproc, backend=backend, dtype=args.dtype)
    if report is None:  # a launched rank other than 0: rank 0 reports
        return 0
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def register(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks of this machine (bench comm: collective bandwidth)",
                                  description="Measure this machine. `sampan bench comm` times collectives.")
    benches = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    comm = benches.add_parser(
        "comm", help="bus bandwidth of all_reduce / all_gather / reduce_scatter / send_recv by message size",
        description="nccl-tests-style collective benchmark: median time per op and message size, algorithm "
                    "bandwidth (size / time) and bus bandwidth (algbw x 2(n-1)/n for all_reduce, (n-1)/n for "
                    "all_gather and reduce_scatter, 1 for send_recv). Under a launcher (sampan launch / torchrun) "
                    "it uses that group; run alone it spawns --nproc local gloo ranks.")
    comm.add_argument("--sizes", default="1KB,64KB,1MB,16MB",
                      help="comma-separated message sizes, B / KB / MB / GB (powers of 1024) "
                           "(default: 1KB,64KB,1MB,16MB)")
    comm.add_argument("--ops", default="all", help="comma-separated ops, or all: all_reduce, all_gather, "
                                                   "reduce_scatter, send_recv (default: all)")
    comm.add_argument("--iters", type=int, default=20, help="timed iterations per op and size (default: 20)")
    comm.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default: 3)")
    comm.add_argument("--nproc", type=int, default=2,
                      help="ranks to spawn when not under a launcher (default: 2)")
    comm.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                      help="auto: the launcher's group, or gloo for spawned ranks (default: auto)")
    comm.add_argument("--device", default="auto", metavar="DEVICE",
                      help="auto, cpu (gloo) or cuda / cuda:N (NCCL; under a launcher each rank takes its "
                           "LOCAL_RANK GPU) (default: auto, as --backend says)")
    comm.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                      help="element type of the buffers (default: float32)")
    comm.add_argument("--json", action="store_true", help="print JSON instead of a table")
    set_handler(comm, run_comm)

"""``sampan launch``: run a script on N ranks per node through torchrun (``sampan.distributed.launch``)."""

from __future__ import annotations

import argparse

from sampan.commands import set_handler


def run(args: argparse.Namespace) -> int:
    from sampan.distributed.launch import LaunchConfig, launch

    return launch(LaunchConfig(script=args.script, script_args=list(args.script_args),
                               nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
                               rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                               max_restarts=args.max_restarts, standalone=args.standalone, log_dir=args.log_dir,
                               module=args.module, local_addr=args.local_addr, master_addr=args.master_addr,
                               master_port=args.master_port))


def register(subparsers) -> None:
    launch = subparsers.add_parser(
        "launch", help="run a script on N ranks per node (torchrun, with sampan's defaults)",
        description="Start NPROC_PER_NODE ranks of SCRIPT on this node through torchrun. One node without "
                    "--rdzv_endpoint gets a private rendezvous (--standalone). Adds OMP_NUM_THREADS=1 per rank "
                    "when unset, and makes --max_restarts work on gloo (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1). "
                    "Everything after SCRIPT goes to the script.",
        epilog="examples:  sampan launch --nproc_per_node 2 train.py --lr 3e-4\n"
               "           sampan launch --nproc_per_node 2 --max_restarts 3 train.py   (restart on a failure)\n"
               "           sampan launch --nproc_per_node 8 --nnodes 2 --rdzv_endpoint node0:29400 train.py"
               "   (on each node)\n"
               "           sampan launch --nproc_per_node 8 --nnodes 2 --node_rank 0 --master_addr node0 "
               "--master_port 29500 train.py   (torchrun's static rendezvous; --node_rank 1 on the other node)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_argument("--nproc_per_node", "--nproc-per-node", default="1", metavar="N",
                        help="ranks on this node: a positive count, or auto / cpu / gpu (default: 1)")
    launch.add_argument("--nnodes", default="1", metavar="M",
                        help="number of nodes, or MIN:MAX for an elastic range (default: 1)")
    launch.add_argument("--node_rank", "--node-rank", type=int, default=None, metavar="R",
                        help="this node's fixed rank (static rendezvous, no restarts); omit it and the elastic "
                             "c10d rendezvous numbers the nodes")
    launch.add_argument("--rdzv_endpoint", "--rdzv-endpoint", default=None, metavar="HOST:PORT",
                        help="rendezvous address, the same on every node (needed for --nnodes > 1)")
    launch.add_argument("--rdzv_id", "--rdzv-id", default=None, metavar="ID",
                        help="job id shared by the nodes of one job (c10d rendezvous)")
    launch.add_argument("--max_restarts", "--max-restarts", type=int, default=0, metavar="K",
                        help="restart the whole group up to K times after a worker fails; the script resumes "
                             "from its checkpoint (default: 0)")
    launch.add_argument("--standalone", action="store_true",
                        help="one node, private rendezvous on a free port (the default for one node without "
                             "--rdzv_endpoint)")
    launch.add_argument("--log_dir", "--log-dir", default=None, help="directory for torchrun's per-worker logs")
    launch.add_argument("--master_addr", "--master-addr", default=None, metavar="HOST",
                        help="torchrun's: address of the static rendezvous's master, node 0 (default: 127.0.0.1; "
                             "instead of --rdzv_endpoint; several nodes need it and --node_rank)")
    launch.add_argument("--master_port", "--master-port", type=int, default=None, metavar="PORT",
                        help="torchrun's: port of the static rendezvous's master (default: 29500 on several nodes; "
                             "one node without it gets a private rendezvous on a free port)")
    launch.add_argument("--local_addr", "--local-addr", default=None, metavar="ADDR",
                        help="address the other nodes reach this node at (default: the one this node uses to "
                             "reach --rdzv_endpoint)")
    launch.add_argument("-m", "--module", action="store_true",
                        help="SCRIPT is a module name, run as `python -m SCRIPT` (e.g. -m sampan.cli bench comm)")
    launch.add_argument("script", help="the Python script every rank runs (a module name with -m)")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="passed through to the script")
    set_handler(launch, run)

"""``sampan launch``: run a script on N ranks per node through torchrun (``sampan.distributed.launch``)."""

from __future__ import annotations

import argparse

from sampan.commands import set_handler


def run(args: argparse.Namespace) -> int:
    from sampan.distributed.launch import LaunchConfig, launch
    from sampan.utils.flags import dataclass_from_args

    return launch(dataclass_from_args(LaunchConfig, args))


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
    from sampan.distributed.launch import LaunchConfig  # torch-free: plain data
    from sampan.utils.flags import add_dataclass_args

    # torchrun's spellings (--nproc_per_node), and the dashed ones every other sampan flag uses.
    flags = {name: (f"--{name}", f"--{name.replace('_', '-')}") for name in (
        "nproc_per_node", "node_rank", "rdzv_endpoint", "rdzv_id", "max_restarts", "log_dir", "master_addr",
        "master_port", "local_addr")}
    add_dataclass_args(launch, LaunchConfig, positional={"script": None, "script_args": argparse.REMAINDER},
                       flags={**flags, "module": ("-m", "--module")},
                       metavars={"nproc_per_node": "N", "nnodes": "M", "node_rank": "R", "rdzv_endpoint": "HOST:PORT",
                                 "rdzv_id": "ID", "max_restarts": "K", "master_addr": "HOST", "master_port": "PORT",
                                 "local_addr": "ADDR", "log_dir": "DIR", "script": "SCRIPT", "script_args": "ARGS"})
    set_handler(launch, run)

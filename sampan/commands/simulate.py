"""``sampan simulate``: fleet's real code for one rank of a big layout at a time, under torch's fake
process group and fake tensors, next to what ``sampan plan`` predicts (docs/scale.md). Flags from
``SimulateOptions``, which nests the planner's ``Job`` (shared with ``sampan plan``).

Building the parser imports no torch (the planner is torch-free); the handler imports
``sampan.distributed.simulate``, which does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Literal

from sampan.commands import arguments_later, set_handler
from sampan.planner.job import GpuChoice, Job
from sampan.utils.config import nested, resolve_nested
from sampan.utils.flags import REPEAT
from sampan.utils.output import Output


@dataclasses.dataclass
class SimulateOptions:
    """What to simulate and how to answer.

    Fields:
        job: the model on a cluster, in the layout given by ``--fix`` (or ``--strategy``).
        gpu: the GPUs the worst rank must fit in (their memory; the other figures are the plan's).
        strategy: the layout as a Paddle-style DistributedStrategy dict instead of --fix: inline JSON
            or a .json / .toml / .yaml file (a run file's [strategy] table), e.g. '{"hybrid_configs":
            {"dp_degree": 8, "mp_degree": 8, "pp_degree": 16}, "pipeline_configs": {"accumulate_steps": 192}}'.
        pipeline_stages: pipeline stages to simulate, one rank each: the first and the last ("ends": they
            hold the embedding / the head and the most / fewest micro-batches in flight) or every stage.
        ranks: simulate these global ranks instead (--rank, repeatable).
        micro_batches_run: micro-batches to run (default: enough to reach the schedule's peak:
            min(m, pp) for 1F1B, 2 pp interleaved, all for GPipe and on the last stage, 2 without a
            pipeline; the receive buffers of the ones not run are added).
        processes: ranks simulated at once, one process each.
        output: how the answer is printed.
    """

    job: Job = nested(Job, flatten=True)
    gpu: GpuChoice = nested(GpuChoice, flatten=True)
    strategy: str | None = None
    pipeline_stages: Literal["ends", "all"] = "ends"
    ranks: list[int] = dataclasses.field(default_factory=list, metadata={REPEAT: True})
    micro_batches_run: int | None = None
    processes: int = 2
    output: Output = nested(Output, flatten=True)

    def __post_init__(self) -> None:
        resolve_nested(self)
        self.ranks = [int(r) for r in self.ranks]
        if self.processes < 1:
            raise ValueError(f"--processes must be >= 1, got {self.processes}")


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.planner.hardware import PRESETS
    from sampan.planner.layout import FIX_METAVAR
    from sampan.utils.flags import add_dataclass_args

    # Only the memory decides a fit here; the rest of the GPU's figures price time, which is sampan plan's.
    add_dataclass_args(parser, SimulateOptions, required=("job.model", "job.gpus"),
                       exclude=("gpu.gpus_per_node", "gpu.gpu_tflops", "gpu.intra_node_gbps", "gpu.inter_node_gbps",
                                "gpu.matmul_efficiency"),
                       flags={"ranks": ("--rank",), "micro_batches_run": ("--num-micro",),
                              "pipeline_stages": ("--stages",)},
                       choices={"gpu.hardware": sorted(PRESETS)},
                       metavars={"job.fix": FIX_METAVAR, "strategy": "JSON_OR_FILE", "ranks": "RANK"})


def run(args: argparse.Namespace) -> int:
    from sampan.planner.report import print_simulation
    from sampan.planner.simulation import simulate_job
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(SimulateOptions, args)
    report = simulate_job(options.job, options.strategy, options.gpu.resolve().memory_gb, ranks=options.ranks,
                          stages=options.pipeline_stages, num_micro=options.micro_batches_run,
                          processes=options.processes)
    if options.output.json:
        print(json.dumps(report, indent=2))
    else:
        print_simulation(report)
    return 0


def register(subparsers) -> None:
    sim = subparsers.add_parser(
        "simulate", help="run fleet's real code for a big layout one rank at a time on fake tensors; compare with "
                         "`sampan plan`",
        description=(
            "Join torch's fake process group as one rank of the layout, build the model on fake tensors (no\n"
            "memory), split it with fleet (tensor parallel, pipeline stage, FSDP2 sharding, recompute) and run one\n"
            "training step: forward, backward, clip, AdamW. Reports per rank the parameter, gradient and\n"
            "optimizer bytes of its local shards, the step's peak memory and the collectives it issued, next to\n"
            "`sampan plan`'s prediction for the same layout, per component. One rank per pipeline stage is\n"
            "simulated (the first and the last by default); the worst decides. Check a layout with it before\n"
            "renting a cluster. What the fake backend cannot do, and what is done instead: docs/scale.md."),
        epilog="examples:\n"
               "  sampan simulate --model gpt-175b --gpus 1024 --fix dp=8,mp=8,pp=16,micro_batch=1 "
               "--seq-len 2048 --global-batch 1536\n"
               "  sampan simulate --model llama3-405b --gpus 8192 --fix dp=64,mp=8,pp=16,schedule=interleaved,vpp=2 "
               "--seq-len 8192 --global-batch 2048 --json\n"
               "  sampan simulate --model gpt-tiny --gpus 8 --strategy '{\"hybrid_configs\": {\"dp_degree\": 2, "
               "\"mp_degree\": 2, \"pp_degree\": 2}, \"pipeline_configs\": {\"accumulate_steps\": 2}}' "
               "--seq-len 64 --global-batch 8",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments_later(sim, _arguments)
    set_handler(sim, run)

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
import time
from typing import Any, Literal

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
        if (self.job.fix is None) == (self.strategy is None):
            raise ValueError("give the layout with --fix dp=..,mp=..,pp=.. or --strategy JSON_OR_FILE (one of them)")
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


def read_strategy(text: str) -> dict[str, Any]:
    """``--strategy``: inline JSON, or a config file whose ``[strategy]`` table (or whole body) it is."""
    from pathlib import Path

    from sampan.utils.config_files import load_config_file, parse_config_text

    if text.strip().startswith("{"):
        data = parse_config_text(text, ".json", "--strategy")
    elif Path(text).is_file():
        data = load_config_file(text)
        data = data.get("strategy", data)
    else:
        raise ValueError(f"--strategy {text!r} is neither a JSON object nor a file")
    if not isinstance(data, dict):
        raise ValueError("--strategy must be a JSON object of DistributedStrategy sections")
    return data


def run(args: argparse.Namespace) -> int:
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(SimulateOptions, args)
    job = options.job
    from sampan.distributed.strategy import DistributedStrategy
    from sampan.models.registry import list_models
    from sampan.planner.model_shape import load_config, shape_from_config
    from sampan.planner.report import print_simulation
    from sampan.planner.simulation import compare_with_plan, strategy_layout, verdict

    amp = not job.fp32
    work = job.workload()
    name, config = load_config(job.model)
    registered = job.model in list_models()
    shape = shape_from_config(name, config, registered=job.model if registered else None)
    if job.fix is not None:
        strategy = job.layout().to_strategy(amp=work.amp)
    else:
        strategy = DistributedStrategy.from_dict(read_strategy(options.strategy))
        strategy.amp = work.amp
    degrees = strategy.resolve_degrees(job.gpus)
    strategy.check_precision()
    layout = strategy_layout(strategy.to_dict(), degrees, job.global_batch, amp)
    if degrees["cp"] > 1:
        from sampan.distributed.context_parallel import check_sequence

        check_sequence(work.seq_len, degrees["cp"])
    overrides: dict[str, Any] = {}
    vocab = shape.padded_vocab(degrees["mp"])
    if vocab != config.vocab_size:  # as `sampan plan --write-strategy` pads it
        overrides["vocab_size"] = vocab
    try:
        strategy.validate_for_model(config.num_heads, config.num_layers, vocab, degrees,
                                    num_kv_heads=getattr(config, "num_kv_heads", None))
    except ValueError as err:
        raise ValueError(str(err).replace(":\n  - ", ": ").replace("\n  - ", "; ")) from None
    if work.seq_len > config.max_position_embeddings:
        raise ValueError(f"--seq-len {work.seq_len} exceeds {job.model}'s max_position_embeddings "
                         f"{config.max_position_embeddings}")
    bad = [r for r in options.ranks if not 0 <= r < job.gpus]
    if bad:
        raise ValueError(f"--rank {bad[0]} is outside 0..{job.gpus - 1}")

    from sampan.distributed.simulate import simulate

    start = time.perf_counter()
    results = simulate(job.model if registered else config.to_dict(), strategy, job.gpus, job.global_batch,
                       work.seq_len, ranks=options.ranks or None, stages=options.pipeline_stages,
                       num_micro=options.micro_batches_run, amp=amp, processes=options.processes,
                       model_overrides=overrides or None)
    rows = compare_with_plan(results, shape, layout, work)
    report = {"model": name, "parameters": config.num_parameters(), "gpus": job.gpus,
              "layout": layout.to_dict(), "label": layout.label(), "seq_len": work.seq_len,
              "global_batch": job.global_batch, "amp": work.amp, "model_overrides": overrides, "ranks": rows,
              **verdict(rows, options.gpu.resolve().memory_gb), "wall_seconds": time.perf_counter() - start,
              "method": "fleet's real code on one rank at a time: torch's fake process group + FakeTensorMode "
                        "(docs/scale.md)"}
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

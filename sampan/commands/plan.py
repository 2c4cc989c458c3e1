"""``sampan plan``: the auto-parallel planner on paper (``sampan.planner``). Flags from ``PlanOptions``,
which nests ``Job`` (the model on a cluster, shared with ``sampan simulate``) and ``GpuChoice``.
Torch-free: ``sampan plan`` answers in about a second."""

from __future__ import annotations

import argparse
import dataclasses
import json

from sampan.commands import arguments_later, set_handler
from sampan.planner.job import GpuChoice, Job
from sampan.utils.config import nested, resolve_nested
from sampan.utils.output import Output


@dataclasses.dataclass
class PlanOptions:
    """What to plan and how to answer.

    Fields:
        job: the model on a cluster, and optionally one layout to price (``--fix``).
        gpu: the cluster's GPUs.
        model_shape: an inline GPT shape instead of --model, layers=..,hidden=..,heads=..,vocab=..
            (optional ffn=, max_positions=, tied=); gated=true (or kv_heads=, head_dim=) makes it a
            Llama-style block (SwiGLU of width ffn=, RMSNorm, RoPE, kv_heads key/value heads).
        from_run: a finished Trainer run's output directory: where its step time went (measured
            step and data wait; the rest split as the model predicts) next to the prediction for
            its layout. Without --hardware / --gpu-* the hardware is this CPU (the run's measured
            matmul rate; assumptions printed).
        top: rows to show.
        write_strategy: write the best (or --fix) layout as a run file `sampan train --config` takes.
        output: how the answer is printed.
    """

    job: Job = nested(Job, flatten=True)
    gpu: GpuChoice = nested(GpuChoice, flatten=True)
    model_shape: str | None = None
    from_run: str | None = None
    top: int = 10
    write_strategy: str | None = None
    output: Output = nested(Output, flatten=True)

    def __post_init__(self) -> None:
        resolve_nested(self)
        if self.top < 1:
            raise ValueError(f"--top must be >= 1, got {self.top}")


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.planner.hardware import PRESETS
    from sampan.planner.layout import FIX_METAVAR, MOE_DISPATCH
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(parser, PlanOptions, choices={"gpu.hardware": sorted(PRESETS), "job.moe_dispatch": MOE_DISPATCH},
                       metavars={"job.fix": FIX_METAVAR, "write_strategy": "FILE", "from_run": "OUTPUT_DIR",
                                 "model_shape": "layers=..,hidden=..,heads=..,vocab=.."})


def run(args: argparse.Namespace) -> int:
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(PlanOptions, args)
    if options.from_run is not None:
        return _run_from_run(options)
    from sampan.planner.job import plan_job
    from sampan.planner.model_shape import load_model
    from sampan.planner.report import print_table, run_file_text, to_json, write_run_file

    job = options.job
    model = load_model(job.model, options.model_shape)
    hw = options.gpu.resolve()
    work = job.workload()
    plans, result = plan_job(model, job, hw, options.top)
    if options.output.json:
        print(json.dumps(to_json(model, hw, work, job.gpus, plans, result), indent=2))
    else:
        print_table(model, hw, work, job.gpus, plans, result)
    if options.write_strategy:
        path = write_run_file(options.write_strategy, run_file_text(model, work, plans[0]))
        if not options.output.json:
            print(f"wrote {path} (sampan train --config {path})")
    return 0


def _run_from_run(options: PlanOptions) -> int:
    """``--from-run OUTPUT_DIR``: the run's measured step next to the prediction for its layout."""
    from sampan.planner.from_run import print_comparison, report_for_run

    for flag, value in (("--fix", options.job.fix), ("--write-strategy", options.write_strategy),
                        ("--gpus", options.job.gpus)):
        if value is not None:
            raise ValueError(f"{flag} does not apply to --from-run (the run's own layout and ranks are used)")
    report, notes = report_for_run(options.from_run, options.job.model, options.model_shape, options.job.seq_len,
                                   options.gpu)
    if options.output.json:
        print(json.dumps(report, indent=2))
    else:
        print_comparison(report, notes)
    return 0


def register(subparsers) -> None:
    plan = subparsers.add_parser(
        "plan", help="choose dp / mp / pp / sharding / micro-batch / recompute for a model on a cluster (on paper)",
        description="Search every valid hybrid-parallel layout of a model on N GPUs, predict memory per GPU and step "
                    "time from closed forms (ZeRO state, Korthikanti activations, alpha-beta collectives, pipeline "
                    "bubble), and rank them. --fix prices one layout; --write-strategy writes a run file for "
                    "`sampan train`. Formulas and their validation: docs/planner.md.",
        epilog="example:  sampan plan --model gpt-175b --gpus 1024 --hardware a100-80g --seq-len 2048 "
               "--global-batch 1536 --top 10")
    arguments_later(plan, _arguments)
    set_handler(plan, run)

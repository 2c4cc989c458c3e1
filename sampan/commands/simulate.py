"""``sampan simulate``: fleet's real code for one rank of a big layout at a time, under torch's fake
process group and fake tensors, next to what ``sampan plan`` predicts (docs/scale.md).

Building the parser imports no torch (the planner's layout parsing is torch-free); the handler
imports ``sampan.distributed.simulate``, which does.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from sampan.commands import set_handler

GB = 1e9
COMPONENTS = (("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer state"),
              ("other", "activations + buffers"), ("total", "peak (no reserve)"))


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.planner.layout import FIX_METAVAR  # torch-free

    what = parser.add_argument_group("model and workload")
    what.add_argument("--model", required=True,
                      help="a name from `sampan models` (gpt-175b, llama3-405b, llama3-8b, gpt-tiny, ...) or a config "
                           "file: a Hugging Face config.json (Llama / Qwen2 / Qwen3), sampan's config.json, a run file")
    what.add_argument("--gpus", type=int, required=True, help="world size: the ranks of the layout (e.g. 1024)")
    what.add_argument("--seq-len", type=int, default=2048, help="tokens per sequence (default: 2048)")
    what.add_argument("--global-batch", type=int, default=1536, help="sequences per optimizer step (default: 1536)")
    what.add_argument("--fp32", action="store_true",
                      help="simulate fp32 training instead of bf16 (autocast at amp=O1, bf16 parameters at amp=O2)")
    how = parser.add_argument_group("layout (one of the two)")
    how.add_argument("--fix", default=None, metavar=FIX_METAVAR,
                     help="the layout as `sampan plan --fix` spells it (missing dp takes the leftover ranks; also "
                          "stage=, sp=, cp=, amp=O1|O2, master_weights=, master_grads=, num_micro=; the micro-batch "
                          "count follows from the global batch)")
    how.add_argument("--strategy", default=None, metavar="JSON_OR_FILE",
                     help="a Paddle-style DistributedStrategy dict, inline JSON or a .json / .toml file (a run file's "
                          "[strategy] table), e.g. '{\"hybrid_configs\": {\"dp_degree\": 8, \"mp_degree\": 8, "
                          "\"pp_degree\": 16}, \"pipeline_configs\": {\"accumulate_steps\": 192}}'")
    run = parser.add_argument_group("what to run")
    run.add_argument("--stages", choices=("ends", "all"), default="ends",
                     help="pipeline stages to simulate, one rank each: the first and the last (default; they hold "
                          "the embedding / the head and the most / fewest micro-batches in flight) or every stage")
    run.add_argument("--rank", type=int, action="append", default=None,
                     help="simulate this global rank instead (repeatable)")
    run.add_argument("--num-micro", type=int, default=None,
                     help="micro-batches to run (default: enough to reach the schedule's peak: min(m, pp) for 1F1B, "
                          "2 pp interleaved, all for GPipe and on the last stage, 2 without a pipeline; the "
                          "receive buffers of the ones not run are added)")
    run.add_argument("--processes", type=int, default=2, help="ranks simulated at once, one process each (default: 2)")
    run.add_argument("--gpu-memory-gb", type=float, default=80.0,
                     help="memory per GPU to judge the fit against (default: 80)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print JSON instead of tables")


def register(subparsers) -> None:
    from sampan.commands import arguments_later

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


def _read_strategy(text: str) -> dict[str, Any]:
    path = Path(text)
    if text.strip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"--strategy is not valid JSON: {err}") from None
    elif path.is_file():
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(path.read_text(encoding="utf-8"))
            data = data.get("strategy", data)
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
    else:
        raise ValueError(f"--strategy {text!r} is neither a JSON object nor a file")
    if not isinstance(data, dict):
        raise ValueError("--strategy must be a JSON object of DistributedStrategy sections")
    return data


def _layout_of(strategy, degrees: dict[str, int], global_batch: int, amp: bool):
    """The planner's ``Layout`` of a strategy."""
    from sampan.planner.layout import Layout

    pipe = strategy.pipeline_configs
    data = degrees["dp"] * degrees["sharding"]
    if global_batch % (data * pipe.accumulate_steps):
        raise ValueError(f"the global batch {global_batch} does not split into data ranks ({data}) x micro-batches "
                         f"(accumulate_steps {pipe.accumulate_steps})")
    return Layout.from_strategy(strategy.to_dict(), degrees, micro_batch=global_batch // (data * pipe.accumulate_steps),
                                num_micro=pipe.accumulate_steps, amp=amp)


def _planned(shape, layout, work, stage: int) -> dict[str, float]:
    from sampan.planner.memory import _stage_memory

    mem = _stage_memory(shape, layout, work, stage)
    return {"params": mem.params, "grads": mem.grads, "optimizer": mem.optimizer,
            "activations": mem.activations, "buffers": mem.buffers,
            "other": mem.activations + mem.buffers, "total": mem.total - mem.reserved, "reserved": mem.reserved}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def run(args: argparse.Namespace) -> int:
    from sampan.models.registry import list_models
    from sampan.planner.layout import Workload, parse_fix
    from sampan.planner.model_shape import load_config, shape_from_config

    if (args.fix is None) == (args.strategy is None):
        raise ValueError("give the layout with --fix dp=..,mp=..,pp=.. or --strategy JSON_OR_FILE (one of them)")
    for flag, value in (("--gpus", args.gpus), ("--seq-len", args.seq_len), ("--global-batch", args.global_batch),
                        ("--processes", args.processes)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    amp = not args.fp32
    work = Workload(args.seq_len, args.global_batch, "bf16" if amp else None)
    name, config = load_config(args.model)
    registered = args.model in list_models()
    shape = shape_from_config(name, config, registered=args.model if registered else None)
    from sampan.distributed.strategy import DistributedStrategy

    if args.fix is not None:
        layout = parse_fix(args.fix, args.gpus, work)
        strategy = layout.to_strategy(amp="bf16" if amp else None)
    else:
        strategy = DistributedStrategy.from_dict(_read_strategy(args.strategy))
        strategy.amp = "bf16" if amp else None
    degrees = strategy.resolve_degrees(args.gpus)
    strategy.check_precision()
    layout = _layout_of(strategy, degrees, args.global_batch, amp)
    if degrees["cp"] > 1:
        from sampan.distributed.context_parallel import check_sequence

        check_sequence(args.seq_len, degrees["cp"])
    overrides: dict[str, Any] = {}
    vocab = shape.padded_vocab(degrees["mp"])
    if vocab != config.vocab_size:  # as `sampan plan --write-strategy` pads it
        overrides["vocab_size"] = vocab
    try:
        strategy.validate_for_model(config.num_heads, config.num_layers, vocab, degrees,
                                    num_kv_heads=getattr(config, "num_kv_heads", None))
    except ValueError as err:
        raise ValueError(str(err).replace(":\n  - ", ": ").replace("\n  - ", "; ")) from None
    if args.seq_len > config.max_position_embeddings:
        raise ValueError(f"--seq-len {args.seq_len} exceeds {args.model}'s max_position_embeddings "
                         f"{config.max_position_embeddings}")
    if args.rank is not None:
        bad = [r for r in args.rank if not 0 <= r < args.gpus]
        if bad:
            raise ValueError(f"--rank {bad[0]} is outside 0..{args.gpus - 1}")

    import time

    from sampan.distributed.simulate import simulate

    start = time.perf_counter()
    results = simulate(args.model if registered else config.to_dict(), strategy, args.gpus, args.global_batch,
                       args.seq_len, ranks=args.rank,
                       stages=args.stages, num_micro=args.num_micro, amp=amp, processes=args.processes,
                       model_overrides=overrides or None)
    wall = time.perf_counter() - start
    rows = []
    for res in results:
        sim = {"params": res["params"], "grads": res["grads"], "optimizer": res["optimizer"],
               "other": res["peak_other"], "total": res["peak_total"]}
        plan = _planned(shape, layout, work, res["coords"]["pp"])
        rows.append({"rank": res["rank"], "coords": res["coords"], "stages": res["stages"],
                     "num_micro_run": res["num_micro"], "seconds": res["seconds"],
                     "simulated_bytes": sim, "planned_bytes": plan,
                     "ratio": {k: _ratio(sim[k], plan[k]) for k in sim},
                     "peak_bytes": res["peak"], "peak_breakdown": res["peak_breakdown"],
                     "collectives": res["collectives"], "notes": res["notes"]})
    worst = max(rows, key=lambda r: r["simulated_bytes"]["total"])
    need = worst["simulated_bytes"]["total"] + worst["planned_bytes"]["reserved"]
    report = {"model": name, "parameters": config.num_parameters(), "gpus": args.gpus,
              "layout": layout.to_dict(), "label": layout.label(), "seq_len": args.seq_len,
              "global_batch": args.global_batch, "amp": "bf16" if amp else None, "model_overrides": overrides,
              "ranks": rows, "worst_rank": worst["rank"], "worst_needs_bytes": need,
              "reserve_bytes": worst["planned_bytes"]["reserved"],
              "gpu_memory_bytes": args.gpu_memory_gb * GB, "fits": need <= args.gpu_memory_gb * GB,
              "wall_seconds": wall,
              "method": "fleet's real code on one rank at a time: torch's fake process group + FakeTensorMode "
                        "(docs/scale.md)"}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 0


def _gb(n: float | None, unit: float = GB) -> str:
    return "-" if n is None or (isinstance(n, float) and math.isnan(n)) else f"{n / unit:,.2f}"


def _print(report: dict[str, Any]) -> None:
    lay = report["layout"]
    sched = "-" if lay["pp"] == 1 else (f"interleaved v{lay['vpp']}" if lay["vpp"] > 1 else lay["schedule"])
    print(f"sampan simulate: {report['model']} ({report['parameters'] / 1e9:.1f}B) on {report['gpus']:,} ranks · "
          f"{report['label']} · {sched} · micro-batch {lay['micro_batch']} x {lay['num_micro']} · recompute "
          f"{lay['recompute']} · {report['amp'] or 'fp32'} · seq {report['seq_len']} · global batch "
          f"{report['global_batch']}")
    print(f"  {report['method']}")
    if report["model_overrides"]:
        print(f"  model changed as sampan plan --write-strategy does: {report['model_overrides']}")
    small = max(r["simulated_bytes"]["total"] for r in report["ranks"]) < GB
    unit, name = (1e6, "MB") if small else (GB, "GB")
    for row in report["ranks"]:
        c = row["coords"]
        print(f"\nrank {row['rank']} (pp {c['pp']}, dp {c['dp']}, sharding {c['sharding']}, cp {c['cp']}, mp {c['mp']}; "
              f"stages {row['stages']}): {row['num_micro_run']} micro-batches run, {row['seconds']:.0f} s")
        print(f"  {'component':<24} {'simulated ' + name:>13} {'planned ' + name:>11} {'sim/plan':>9}")
        for key, label in COMPONENTS:
            r = row["ratio"][key]
            print(f"  {label:<24} {_gb(row['simulated_bytes'][key], unit):>13} {_gb(row['planned_bytes'][key], unit):>11} "
                  f"{'-' if r is None else f'{r:.3f}':>9}")
        plan = row["planned_bytes"]
        print(f"  (planned activations {_gb(plan['activations'], unit)} + buffers {_gb(plan['buffers'], unit)} {name}; "
              f"the planner's {_gb(plan['reserved'])} GB reserve is not simulated)")
        if row["peak_breakdown"]:
            print(f"  largest at the peak (op, dtype, shape: count x, {name}):")
            for group in row["peak_breakdown"][:6]:
                shape = "x".join(map(str, group["shape"])) or "scalar"
                print(f"    {group['op']:<28} {group['dtype']:<9} {shape:<22} {group['count']:>5} x  "
                      f"{_gb(group['bytes'], unit):>9}")
        comm = row["collectives"]
        if comm:
            parts = [f"{kind} {v['calls']} x, {_gb(v['payload_bytes'], unit)} {name} payload, "
                     f"{_gb(v['wire_bytes'], unit)} {name} wire" for kind, v in comm.items()]
            print("  collectives: " + "; ".join(parts))
        for note in row["notes"]:
            print(f"  note: {note}")
    verdict = "fits" if report["fits"] else "does NOT fit"
    print(f"\nworst: rank {report['worst_rank']} needs {_gb(report['worst_needs_bytes'])} GB (simulated peak + the "
          f"planner's {_gb(report['reserve_bytes'])} GB reserve): {verdict} in {report['gpu_memory_bytes'] / GB:g} GB; "
          f"simulated in {report['wall_seconds']:.0f} s")

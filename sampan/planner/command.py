"""The ``sampan plan`` verb: arguments in, a table / JSON / run file out."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from sampan.planner.hardware import PRESETS, get_hardware
from sampan.planner.layout import FIX_METAVAR, Workload, parse_fix
from sampan.planner.model_shape import load_model
from sampan.planner.report import print_table, run_file_text, to_json, write_run_file
from sampan.planner.search import check_inputs, evaluate, mp_problem, search


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("model and workload")
    what.add_argument("--model", default=None, help="a name from `sampan models` (e.g. gpt-175b, qwen2.5-7b) or a "
                                                    "config file (sampan's or a Hugging Face llama / qwen2 / qwen3 "
                                                    "config.json, or a run file's [model] table)")
    what.add_argument("--model-shape", default=None, metavar="layers=..,hidden=..,heads=..,vocab=..",
                      help="an inline GPT shape instead of --model (optional ffn=, max_positions=, tied=); "
                           "gated=true (or kv_heads=, head_dim=) makes it a Llama-style block (SwiGLU of width "
                           "ffn=, RMSNorm, RoPE, kv_heads key/value heads)")
    what.add_argument("--seq-len", type=int, default=None,
                      help="tokens per sequence (default: 2048; with --from-run, derived from the run)")
    what.add_argument("--global-batch", type=int, default=1536, help="sequences per optimizer step (default: 1536)")
    what.add_argument("--fp32", action="store_true", help="plan fp32 training instead of bf16 autocast")
    hw = parser.add_argument_group("cluster (a preset, and/or explicit numbers that override it)")
    hw.add_argument("--gpus", type=int, default=None, help="total GPUs (required unless --from-run)")
    hw.add_argument("--hardware", default=None, choices=sorted(PRESETS),
                    help="preset (default: a100-80g): a100-80g, h100-80g, h200")
    hw.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (preset: 8)")
    hw.add_argument("--gpu-memory-gb", type=float, default=None, help="memory per GPU in GB")
    hw.add_argument("--gpu-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s per GPU")
    hw.add_argument("--intra-node-gbps", type=float, default=None,
                    help="NVLink GB/s per GPU, both directions summed (A100 600, H100 900)")
    hw.add_argument("--inter-node-gbps", type=float, default=None,
                    help="network Gb/s per GPU, one direction (HDR 200, NDR 400)")
    hw.add_argument("--matmul-efficiency", type=float, default=None,
                    help="share of peak the matmuls reach (calibrated default: see docs/planner.md)")
    out = parser.add_argument_group("output")
    out.add_argument("--fix", default=None, metavar=FIX_METAVAR,
                     help="evaluate this one layout instead of searching (missing dp takes the leftover GPUs; "
                          "also stage=, sp=, num_micro=)")
    out.add_argument("--from-run", default=None, metavar="OUTPUT_DIR",
                     help="a finished Trainer run: where its step time went (measured step and data wait; the rest "
                          "split as the model predicts) next to the prediction for its layout. Without --hardware / "
                          "--gpu-* the hardware is this CPU (the run's measured matmul rate; assumptions printed)")
    out.add_argument("--top", type=int, default=10, help="rows to show (default: 10)")
    out.add_argument("--json", action="store_true", help="print JSON instead of a table")
    out.add_argument("--write-strategy", default=None, metavar="FILE",
                     help="write the best (or --fix) layout as a run file `sampan train --config` accepts")


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    if args.from_run is not None:
        return _run_from_run(args)
    if args.gpus is None:
        raise ValueError("--gpus is required (total GPUs of the cluster to plan for), e.g. --gpus 1024")
    if args.seq_len is None:
        args.seq_len = 2048
    model = load_model(args.model, args.model_shape)
    hw = get_hardware(args.hardware, gpus_per_node=args.gpus_per_node, memory_gb=args.gpu_memory_gb,
                      tflops=args.gpu_tflops, intra_node_gbps=args.intra_node_gbps,
                      inter_node_gbps=args.inter_node_gbps, matmul_efficiency=args.matmul_efficiency)
    work = Workload(args.seq_len, args.global_batch, None if args.fp32 else "bf16")
    result = None
    if args.fix is not None:
        check_inputs(model, args.gpus, work, hw)
        layout = parse_fix(args.fix, args.gpus, work)
        _check_fixed(model, layout, work)
        plans = [evaluate(model, layout, work, hw)]
    else:
        result = search(model, args.gpus, work, hw, top=args.top)
        plans = result.plans
        if not plans:
            need = result.best_unfitting
            msg = f"no layout of {model.name} fits in {hw.memory_gb:g} GB per GPU on {args.gpus} GPUs"
            if need is not None:
                msg += (f"; the leanest ({need.layout.label()}, recompute {need.layout.recompute}, micro-batch "
                        f"{need.layout.micro_batch}) needs {need.memory.total / 1e9:.1f} GB: add GPUs or memory")
            raise ValueError(msg)
    if args.json:
        print(json.dumps(to_json(model, hw, work, args.gpus, plans, result), indent=2))
    else:
        print_table(model, hw, work, args.gpus, plans, result)
    if args.write_strategy:
        path = write_run_file(args.write_strategy, run_file_text(model, work, plans[0]))
        if not args.json:
            print(f"wrote {path} (sampan train --config {path})")
    return 0


def _check_fixed(model, layout, work) -> None:
    """What sampan would refuse for a --fix layout, said before pricing it."""
    problems = []
    mp = mp_problem(model, layout.mp)
    if mp is not None:
        problems.append(mp)
    if model.layers < layout.pp * layout.vpp:
        problems.append(f"pp x vpp = {layout.pp * layout.vpp} exceeds the {model.layers} layers")
    if layout.pp > 1 and layout.num_micro < layout.pp:
        problems.append(f"{layout.num_micro} micro-batches are fewer than pp {layout.pp} stages")
    if layout.cp > 1 and work.seq_len % (2 * layout.cp):
        problems.append(f"cp {layout.cp} cuts each sequence into {2 * layout.cp} equal chunks, but seq-len "
                        f"{work.seq_len} is not a multiple of {2 * layout.cp}")
    if layout.amp_level == "O2" and not work.amp:
        problems.append("amp=O2 (bf16 parameters) needs bf16: drop --fp32")
    if problems:
        raise ValueError("--fix layout is not valid: " + "; ".join(problems))


def _run_from_run(args: argparse.Namespace) -> int:
    """``--from-run OUTPUT_DIR``: the run's measured step next to the prediction for its layout."""
    from sampan.planner.from_run import compare, hardware_for_run, print_comparison, read_run

    for flag, value in (("--fix", args.fix), ("--write-strategy", args.write_strategy), ("--gpus", args.gpus)):
        if value is not None:
            raise ValueError(f"{flag} does not apply to --from-run (the run's own layout and ranks are used)")
    out = Path(args.from_run)
    if args.model is None and args.model_shape is None:
        config = out / "model" / "config.json"
        if not config.is_file():
            raise ValueError(f"{out} has no model/config.json (save_pretrained); give the run's model with --model "
                             "NAME_OR_CONFIG or --model-shape")
        model = dataclasses.replace(load_model(str(config)), name=f"{out.name} (model/config.json)")
    else:
        model = load_model(args.model, args.model_shape)
    record = read_run(out, model, args.seq_len)
    overrides = {"gpus_per_node": args.gpus_per_node, "memory_gb": args.gpu_memory_gb, "tflops": args.gpu_tflops,
                 "intra_node_gbps": args.intra_node_gbps, "inter_node_gbps": args.inter_node_gbps,
                 "matmul_efficiency": args.matmul_efficiency}
    hw, notes, overlap = hardware_for_run(record, args.hardware, overrides)
    report = compare(record, model, hw, overlap)
    report["assumptions"] = notes
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_comparison(report, notes)
    return 0

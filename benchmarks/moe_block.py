"""One MoE block, forward + backward: sampan's ``MoE`` against transformers' Qwen3-MoE block on the
same weights.

A transformers ``Qwen3MoeSparseMoeBlock`` is built from a config, its weights drawn at random and
copied into a ``sampan.nn.MoE`` by name (the state-dict names are the same). Each side runs
``out = block(x); out.backward(g)`` on ``x [1, tokens, h]`` in fp32:

- ``sampan``: the block as shipped (``GroupedExperts.backend = "auto"``: the padded batched
  matmul on the CPU);
- ``sampan_grouped_mm``: the same block forced onto ``torch._grouped_mm``;
- ``transformers_eager``: transformers' expert loop (``experts_implementation="eager"``), one
  Python iteration per expert hit;
- ``transformers_grouped_mm``: transformers' ``grouped_mm`` experts, what a whole transformers 5
  model picks by default.

Before timing, every side's output and input gradient must equal ``transformers_eager``'s (equal
work; the run records the differences and exits 1 otherwise). Then the sides run in interleaved
blocks (``_common.time_interleaved``: the order flips every block). Reported: step seconds and
``transformers_eager / sampan`` (the issue's goal: >= 1.5x) and the other ratios.

    python benchmarks/moe_block.py                        # full -> benchmarks/results/moe_block.json
    python benchmarks/moe_block.py --quick --out /tmp/m.json   # smoke run (used by a test)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from _common import (
    apply_presets,
    load_average,
    machine_info,
    set_threads,
    time_interleaved,
    timestamp,
    write_json_atomic,
)

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "moe_block.json"
FULL = {"shapes": "16x8,32x8,64x8,64x2", "hidden": 512, "ffn": 256, "tokens": 2048, "repeats": 2}
QUICK = {"shapes": "8x2,16x4", "hidden": 32, "ffn": 16, "tokens": 64, "repeats": 1}
SIDES = ("sampan", "sampan_grouped_mm", "transformers_eager", "transformers_grouped_mm")
GOAL = {"sampan_over_transformers_eager": 1.5}
TOLERANCE = 1e-4  # fp32; summation order differs between the sides


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=None,
                        help="EXPERTSxTOP_K, comma-separated (full 16x8,32x8,64x8,64x2)")
    parser.add_argument("--hidden", type=int, default=None, help="hidden size h (full 512)")
    parser.add_argument("--ffn", type=int, default=None, help="one expert's SwiGLU width (full 256)")
    parser.add_argument("--tokens", type=int, default=None, help="tokens per call (full 2048)")
    parser.add_argument("--repeats", type=int, default=None, help="timed blocks per side and shape (full 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one block each")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    args = apply_presets(args, QUICK if args.quick else FULL, DEFAULT_OUT)
    try:
        args.shape_list = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
        if any(len(s) != 2 or not 1 <= s[1] <= s[0] for s in args.shape_list):
            raise ValueError
    except ValueError:
        parser.error(f"--shapes takes EXPERTSxTOP_K pairs with 1 <= TOP_K <= EXPERTS, got {args.shapes!r}")
    return args


def build(experts: int, top_k: int, args: argparse.Namespace) -> dict[str, torch.nn.Module]:
    """side -> block, all four on the same random weights."""
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from sampan.nn import MoE, MoEConfig

    transformers.logging.set_verbosity_error()
    blocks: dict[str, torch.nn.Module] = {}
    torch.manual_seed(0)
    for impl in ("eager", "grouped_mm"):
        config = transformers.Qwen3MoeConfig(hidden_size=args.hidden, moe_intermediate_size=args.ffn,
                                             num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True,
                                             experts_implementation=impl)
        blocks[f"transformers_{impl}"] = Qwen3MoeSparseMoeBlock(config)
    with torch.no_grad():
        for p in blocks["transformers_eager"].parameters():
            p.normal_(0.0, 0.05)
    state = blocks["transformers_eager"].state_dict()
    blocks["transformers_grouped_mm"].load_state_dict(state)
    for side, backend in (("sampan", "auto"), ("sampan_grouped_mm", "grouped_mm")):
        block = MoE(MoEConfig(hidden_size=args.hidden, num_experts=experts, top_k=top_k,
                              expert_intermediate_size=args.ffn))
        block.load_state_dict(state)
        block.experts.backend = backend
        blocks[side] = block
    return {side: blocks[side] for side in SIDES}


def measure(experts: int, top_k: int, args: argparse.Namespace) -> dict[str, Any]:
    blocks = build(experts, top_k, args)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, args.tokens, args.hidden, generator=gen)
    g = torch.randn(1, args.tokens, args.hidden, generator=gen)

    def step(block: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        xi = x.clone().requires_grad_()
        out = block(xi)
        out.backward(g)
        block.zero_grad(set_to_none=True)
        return out.detach(), xi.grad

    ref_out, ref_grad = step(blocks["transformers_eager"])  # also its warm-up
    diffs = {}
    for side, block in blocks.items():
        out, grad = step(block)  # the warm-up of every side
        diffs[side] = max(float((out - ref_out).abs().max()), float((grad - ref_grad).abs().max()))
    timings = time_interleaved({side: (lambda b=block: step(b)) for side, block in blocks.items()},
                               steps=1, repeats=args.repeats, warmup=0)
    step_s = {side: t.median for side, t in timings.items()}
    row = {
        "experts": experts, "top_k": top_k, "repeats": args.repeats,
        "equal_work": all(d <= TOLERANCE for d in diffs.values()), "max_abs_diff": diffs,
        "step_s": step_s,
        "sampan_over": {side: step_s[side] / step_s["sampan"] for side in SIDES if side != "sampan"},
        "blocks": {side: t.as_dict() for side, t in timings.items()},
    }
    print(f"E={experts:>3} k={top_k}  " + "  ".join(f"{s} {v * 1e3:9.1f} ms" for s, v in step_s.items())
          + f"  | transformers_eager / sampan {row['sampan_over']['transformers_eager']:.2f}x", flush=True)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    threads = set_threads(args.threads)
    machine = machine_info()  # with the load average before the run; loadavg_at_end is after it
    rows = [measure(e, k, args) for e, k in args.shape_list]
    worst = min(row["sampan_over"]["transformers_eager"] for row in rows)
    out = {
        "benchmark": "moe_block",
        "timestamp": timestamp(),
        "machine": machine,
        "quick": args.quick,
        "threads": threads,
        "loadavg_at_end": load_average(),
        "block": {"family": "qwen3_moe", "hidden_size": args.hidden, "expert_intermediate_size": args.ffn,
                  "tokens": args.tokens, "dtype": "float32", "work": "forward + backward"},
        "sides": list(SIDES),
        "shapes": {f"{row['experts']}x{row['top_k']}": row for row in rows},
        "equal_work": all(row["equal_work"] for row in rows),
        "goal": {**GOAL, "measured_worst": worst, "met": worst >= GOAL["sampan_over_transformers_eager"]},
    }
    write_json_atomic(args.out, out)
    print(f"wrote {args.out}")
    if not out["equal_work"]:
        raise SystemExit(f"sides computed different blocks: {[row['max_abs_diff'] for row in rows]}")
    return out


if __name__ == "__main__":
    main()

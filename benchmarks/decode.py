"""Decoding speed: the export's KV-cache graphs against today's full-window path, eager and transformers.

One random Llama (built with ``transformers``, saved, opened by sampan's HF loader: the same weights
on every side) continues one prompt greedily by 64, 256 and 1,024 new tokens (batch 1), on:

- ``cached_ort``: ``create_generator(Config(export))``: the prefill + one-step decode graphs on ONNX
  Runtime, the cache passed between steps (O(n) per token);
- ``cached_pt2``: the same graphs as ``torch.export`` programs (``Config(backend="torch")``);
- ``eager_cached``: sampan's eager ``model.generate`` with its ``KVCache``;
- ``full_window_ort``: the full-window graph (``input_ids -> logits [B, S, V]``) run on the whole
  sequence for every new token on ONNX Runtime: what Taskflow did before the decode graphs (O(n^2));
- ``transformers``: ``LlamaForCausalLM.generate`` (its dynamic cache, SDPA).

Before a length is timed every side generates it once and must give transformers' tokens (equal
work; the run records any difference and exits 1). Then each side runs in interleaved blocks
(``_common.time_interleaved``: the order flips every block). Reported: tokens/s and ratios; the
issue's goal is ``cached_ort`` >= 5x ``full_window_ort`` at 256 tokens.

    python benchmarks/decode.py                   # full -> benchmarks/results/decode.json
    python benchmarks/decode.py --quick --out /tmp/d.json   # smoke run (used by a test)
"""

from __future__ import annotations

import argparse
import tempfile
import time
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

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "decode.json"
# A small Llama (GQA, SwiGLU, RoPE) with the shipped gpt-zh's vocabulary size (6,000): big enough
# that the model, not Python, is most of a step; small enough that 1,024 tokens through the
# full-window path take about a minute on 2 cores.
FULL = {"lengths": "64,256,1024", "repeats": "3,3,1", "hidden": 256, "layers": 4, "vocab": 6000, "prompt": 16}
QUICK = {"lengths": "8,24", "repeats": "1,1", "hidden": 32, "layers": 2, "vocab": 128, "prompt": 5}
SIDES = ("cached_ort", "cached_pt2", "eager_cached", "full_window_ort", "transformers")
GOAL = {"length": 256, "cached_over_full_window": 5.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default=None, help="new tokens per run, comma-separated (full 64,256,1024)")
    parser.add_argument("--repeats", default=None, help="timed blocks per side for each length (full 3,3,1)")
    parser.add_argument("--hidden", type=int, default=None, help="hidden size (full 256; heads of 64)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (full 4)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size (full 6000)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens (full 16)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of every side, torch's and ONNX Runtime's (default 1: a batch-1 step is "
                             "too small to split, and on a shared 2-core machine a second thread mostly waits)")
    parser.add_argument("--quick", action="store_true", help="a tiny model and two short lengths")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    args = apply_presets(args, QUICK if args.quick else FULL, DEFAULT_OUT)
    try:
        args.length_list = [int(n) for n in args.lengths.split(",")]
        args.repeat_list = [int(n) for n in args.repeats.split(",")]
        if len(args.repeat_list) != len(args.length_list) or min(args.length_list + args.repeat_list) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--lengths and --repeats take as many positive ints each, got {args.lengths!r} and {args.repeats!r}")
    return args


def build(args: argparse.Namespace, work: Path):
    """The HF model, sampan's model from its checkpoint, and sampan's export (full-window + decode graphs)."""
    import transformers

    from sampan.inference import export_pretrained
    from sampan.models import from_pretrained

    transformers.logging.set_verbosity_error()
    heads = max(2, args.hidden // 64)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 8 * 8,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=args.prompt + max(args.length_list) + 8, tie_word_embeddings=False,
        eos_token_id=None, bos_token_id=None)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # spread the logits: a random init's near-ties would make greedy paths fragile
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(work / "hf")
    ours = from_pretrained(work / "hf").eval()
    start = time.perf_counter()
    export = export_pretrained(ours, work / "export")
    return hf, ours, export, time.perf_counter() - start


def contenders(hf, ours, export: Path, prompt: list[int], threads: int) -> dict[str, Any]:
    """side -> generate(n) -> the n new token ids (greedy); ONNX Runtime on ``threads`` threads."""
    from sampan.inference import Config, Generator, create_generator, create_predictor
    from sampan.inference.decoders import FullWindowDecoder

    ids = torch.tensor([prompt])
    cached = create_generator(Config(export, num_threads=threads))
    pt2 = create_generator(Config(export, backend="torch"))
    full = Generator(FullWindowDecoder(create_predictor(Config(export, num_threads=threads)), 0,
                                       ours.config.max_position_embeddings))

    def hf_generate(n: int) -> list[int]:
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0)
        return out[0, len(prompt):].tolist()

    return {
        "cached_ort": lambda n: cached.generate(prompt, max_tokens=n)[0].token_ids,
        "cached_pt2": lambda n: pt2.generate(prompt, max_tokens=n)[0].token_ids,
        "eager_cached": lambda n: ours.generate(ids, max_new_tokens=n)[0, len(prompt):].tolist(),
        "full_window_ort": lambda n: full.generate(prompt, max_tokens=n)[0].token_ids,
        "transformers": hf_generate,
    }


def measure(runs: dict[str, Any], length: int, repeats: int) -> dict[str, Any]:
    reference = runs["transformers"](length)
    mismatches = {}
    for side, run in runs.items():
        got = run(length)  # also the warm-up
        if got != reference:
            first = next((i for i, (a, b) in enumerate(zip(got, reference, strict=False)) if a != b),
                         min(len(got), len(reference)))
            mismatches[side] = {"first_differing_token": first, "tokens": len(got)}
    timings = time_interleaved({side: (lambda run=run: run(length)) for side, run in runs.items()},
                               steps=1, repeats=repeats, warmup=0)
    tokens_per_s = {side: length / t.median for side, t in timings.items()}
    row = {"new_tokens": length, "repeats": repeats, "equal_work": not mismatches, "mismatches": mismatches,
           "tokens_per_s": tokens_per_s,
           "cached_ort_over": {side: tokens_per_s["cached_ort"] / tps for side, tps in tokens_per_s.items()
                               if side != "cached_ort"},
           "eager_cached_over_full_window": tokens_per_s["eager_cached"] / tokens_per_s["full_window_ort"],
           "blocks": {side: t.as_dict() for side, t in timings.items()}}
    print(f"{length:>5} new tokens  " + "  ".join(f"{s} {v:8.1f} tok/s" for s, v in tokens_per_s.items())
          + f"  | cached_ort / full_window {row['cached_ort_over']['full_window_ort']:.2f}x", flush=True)
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    threads = set_threads(args.threads)
    machine = machine_info()  # with the load average before the run; loadavg_at_end is after it
    with tempfile.TemporaryDirectory(prefix="sampan-decode-bench-") as tmp:
        hf, ours, export, export_s = build(args, Path(tmp))
        prompt = torch.randint(1, args.vocab, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
        runs = contenders(hf, ours, export, prompt, threads)
        rows = [measure(runs, n, r) for n, r in zip(args.length_list, args.repeat_list, strict=True)]
    by_length = {str(row["new_tokens"]): row for row in rows}
    goal_row = by_length.get(str(GOAL["length"]))
    out = {
        "benchmark": "decode",
        "timestamp": timestamp(),
        "machine": machine,
        "quick": args.quick,
        "threads": threads,
        "loadavg_at_end": load_average(),
        "model": {"family": "llama", "hidden_size": args.hidden, "num_layers": args.layers, "vocab_size": args.vocab,
                  "parameters": ours.num_parameters(), "prompt_tokens": args.prompt, "batch": 1},
        "export_s": export_s,
        "sides": list(SIDES),
        "lengths": by_length,
        "equal_work": all(row["equal_work"] for row in rows),
        "goal": {**GOAL, "measured": goal_row["cached_ort_over"]["full_window_ort"] if goal_row else None,
                 "met": bool(goal_row and goal_row["cached_ort_over"]["full_window_ort"] >= GOAL["cached_over_full_window"])},
    }
    write_json_atomic(args.out, out)
    print(f"wrote {args.out}")
    if not out["equal_work"]:
        raise SystemExit(f"sides generated different tokens: {[row['mismatches'] for row in rows]}")
    return out


if __name__ == "__main__":
    main()

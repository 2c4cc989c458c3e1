"""sampan.jit.to_static vs eager Python and plain torch.compile, on sampan's tiny models.

Two parts, all fp32 on this CPU, every contender on its own copy of the same model:

* ``programs``: gpt-tiny inference (logits of a batch), ernie-tiny inference (sequence
  classification logits) and a gpt-tiny training step (forward through the converted function,
  backward, AdamW step). Contenders: eager; ``to_static``; plain ``torch.compile`` of the same
  function (same backend); and for inference the ``jit.save``-d ONNX file in onnxruntime. Before
  timing, each must return eager's outputs (training: the first step's loss). Reported: median
  step time and speed-up over eager, the first call's time (capture + compile, cold: a fresh
  inductor cache directory and the compiled-graph cache off), graphs built and graph breaks.
* ``generation``: greedy GPT decoding with a data-dependent early exit, the program of
  ``examples/jit_export.py``: a ``while cur < total and not finished.all()`` loop around a GPT
  forward (no KV cache, so every iteration has the same shapes), stopping when every row has
  emitted EOS. ``to_static`` makes the loop one ``torch.while_loop`` (fullgraph); plain
  ``torch.compile`` graph-breaks at the tensor loop condition, so the loop stays in Python;
  onnxruntime runs the exported ``Loop``. Every contender must return eager's tokens and
  stopping position first (equal work).

Steady-state steps are timed in interleaved blocks (``benchmarks/_common.time_interleaved``).
Ratios are eager time / contender time (above 1: faster than eager; the table's "x" columns).

    python benchmarks/to_static.py                          # writes benchmarks/results/to_static.json
    python benchmarks/to_static.py --quick --out /tmp/j.json  # smoke run (eager backend, tiny shapes)
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import sampan
from _common import (
    apply_presets,
    load_average,
    machine_info,
    set_threads,
    time_interleaved,
    timestamp,
    write_json_atomic,
)
from sampan.static import InputSpec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "to_static.json"
DEFAULTS = dict(hidden=64, layers=2, heads=2, vocab=64, prompt_len=4, new_tokens=16, batches=[1, 32], steps=2,
                repeats=8, warmup=1, backend="inductor", program_batch=8, seq_len=32)
QUICK = dict(hidden=32, layers=1, heads=2, vocab=32, prompt_len=3, new_tokens=3, batches=[1, 3], steps=1,
             repeats=2, warmup=1, backend="eager", program_batch=2, seq_len=8)
CONTENDERS = ("eager", "to_static", "torch.compile", "onnxruntime")
SHORT = {"eager": "eager", "to_static": "static", "torch.compile": "compile", "onnxruntime": "ORT"}
SEED = 0


def load_example():
    """``examples/jit_export.py`` as a module (registered: torch.compile imports traced functions' modules)."""
    spec = importlib.util.spec_from_file_location("jit_export_example", ROOT / "examples" / "jit_export.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, help=f"hidden size (default {DEFAULTS['hidden']})")
    parser.add_argument("--layers", type=int, help=f"transformer blocks (default {DEFAULTS['layers']})")
    parser.add_argument("--heads", type=int, help=f"attention heads (default {DEFAULTS['heads']})")
    parser.add_argument("--vocab", type=int, help=f"vocabulary size (default {DEFAULTS['vocab']})")
    parser.add_argument("--prompt-len", type=int, help=f"prompt tokens (default {DEFAULTS['prompt_len']})")
    parser.add_argument("--new-tokens", type=int, help=f"most tokens generated (default {DEFAULTS['new_tokens']})")
    parser.add_argument("--batches", type=int, nargs="+", help=f"batch sizes (default {DEFAULTS['batches']})")
    parser.add_argument("--steps", type=int, help=f"generations per timed block (default {DEFAULTS['steps']})")
    parser.add_argument("--repeats", type=int, help=f"timed blocks per side (default {DEFAULTS['repeats']})")
    parser.add_argument("--warmup", type=int, help=f"untimed generations per side first (default {DEFAULTS['warmup']})")
    parser.add_argument("--program-batch", type=int,
                        help=f"batch of the inference / training programs (default {DEFAULTS['program_batch']})")
    parser.add_argument("--seq-len", type=int,
                        help=f"tokens per row of the inference / training programs (default {DEFAULTS['seq_len']})")
    parser.add_argument("--backend", help="torch.compile backend of to_static and torch.compile "
                        f"(default {DEFAULTS['backend']}; {QUICK['backend']} with --quick)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch and onnxruntime threads (default 1: at batch 1 the ops are tiny, and on a "
                             "machine shared with other jobs a 2-thread pool waits on descheduled threads)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes and few steps (smoke test); writes JSON only when --out is given")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default benchmarks/results/to_static.json; none with --quick)")
    args = parser.parse_args(argv)
    return apply_presets(args, QUICK if args.quick else DEFAULTS, None if args.quick else DEFAULT_OUT)


class CountingBackend:
    """A torch.compile backend, counting the graphs it is given."""

    def __init__(self, name: str) -> None:
        self.graphs = 0
        self._backend = torch._dynamo.lookup_backend(name)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list):
        self.graphs += 1
        return self._backend(gm, example_inputs)


def timed_first_call(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def pick_eos(generate_free, prompt: torch.Tensor, new_tokens: int) -> int:
    """A token that row 0 of ``prompt`` emits half-way, so that batch 1 leaves the loop early."""
    ids, _ = generate_free(prompt[:1])
    return int(ids[0, prompt.shape[1] + max(new_tokens // 2 - 1, 0)])


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


def _forward_program(model):
    """Inference: the logits of a batch (a ``def``, as to_static converts Python functions)."""

    def forward(input_ids, attention_mask):
        # The mask is passed, as a tokenizer makes it: without one, ERNIE builds it from the pad
        # tokens behind `if bool(pad.any())`, a Python branch on a tensor value that no single
        # graph can hold (the branches give a tensor or None).
        return model(input_ids, attention_mask=attention_mask)

    return forward


def _loss_program(model):
    """Training: the next-token loss of a batch; ``to_static`` converts this forward."""

    def loss_fn(input_ids, attention_mask):
        return model(input_ids, attention_mask=attention_mask, labels=input_ids)

    return loss_fn


def _train_step(loss_fn, model):
    """One forward + backward + AdamW step through ``loss_fn``; returns the loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(*inputs):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(*inputs)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def bench_program(name: str, model: torch.nn.Module, batch: tuple[torch.Tensor, ...], args: argparse.Namespace, threads: int,
                  export_dir: Path, train: bool) -> dict:
    """eager vs to_static vs plain torch.compile (vs onnxruntime for inference) on one program, each on
    its own copy of ``model``: equal outputs first, then interleaved timing."""
    models = {side: copy.deepcopy(model) for side in ("eager", "to_static", "torch.compile")}
    build = _loss_program if train else _forward_program
    counting = CountingBackend(args.backend)
    static = sampan.jit.to_static(build(models["to_static"]), backend=args.backend)
    fns = {"eager": build(models["eager"]), "to_static": static,
           "torch.compile": torch.compile(build(models["torch.compile"]), backend=counting)}
    runners = {side: _train_step(fn, models[side]) if train else fn for side, fn in fns.items()}
    first_call_s, outputs, breaks = {}, {}, {}
    grad = torch.enable_grad() if train else torch.no_grad()
    with grad:
        outputs["eager"] = runners["eager"](*batch)
        for side in ("to_static", "torch.compile"):
            before = _graph_breaks()
            outputs[side], first_call_s[side] = timed_first_call(runners[side], *batch)
            breaks[side] = _graph_breaks() - before
    export = None
    if not train:
        files = sampan.jit.save(static, export_dir / name)
        start = time.perf_counter()
        runners["onnxruntime"] = sampan.jit.load(export_dir / name, backend="onnxruntime", num_threads=threads)
        export = {"onnx_mb": files["onnx"].stat().st_size / 2**20, "load_s": time.perf_counter() - start}
        outputs["onnxruntime"] = runners["onnxruntime"](*batch)
    # Equal work: every contender returns eager's logits (inference) or first-step loss (training).
    max_diff = {side: float((out - outputs["eager"]).abs().max()) for side, out in outputs.items()}
    if any(d > 1e-4 for d in max_diff.values()):
        raise RuntimeError(f"{name}: outputs differ from eager: {max_diff}")

    def bound(fn):
        return lambda: fn(*batch)

    with grad:
        timings = time_interleaved({side: bound(fn) for side, fn in runners.items()}, steps=args.steps,
                                   repeats=args.repeats, warmup=args.warmup)
    eager_t = timings["eager"]
    stats = static.stats()
    return {
        "program": "forward + backward + AdamW step" if train else "forward (logits)",
        "batch": list(batch[0].shape),
        "max_abs_diff_vs_eager": max_diff,
        "sides": {side: t.as_dict() for side, t in timings.items()},
        "speedup_over_eager": {side: eager_t.median / t.median for side, t in timings.items() if side != "eager"},
        "first_call_s": first_call_s,
        "graphs": {"to_static": stats["compiles"], "torch.compile": counting.graphs},
        "graph_breaks": {"to_static": stats["graph_breaks"], "torch.compile": breaks["torch.compile"]},
        "onnx_export": export,
    }


def bench_programs(args: argparse.Namespace, threads: int, export_dir: Path) -> dict:
    """gpt-tiny and ernie-tiny inference and a gpt-tiny training step."""
    sizes = dict(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                 intermediate_size=4 * args.hidden, max_position_embeddings=max(args.seq_len, 8))
    gen = torch.Generator().manual_seed(SEED)
    sampan.seed(SEED)
    gpt = sampan.models.create("gpt-tiny", vocab_size=args.vocab, **sizes)
    ernie = sampan.models.create("ernie-tiny", head="sequence_classification", vocab_size=args.vocab, **sizes)
    ids = torch.randint(1, args.vocab, (args.program_batch, args.seq_len), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, args.seq_len // 2:] = 0  # one padded row: the mask does something
    batch = (ids, mask)
    # Dropout off everywhere, so eager and compiled steps compute the same thing.
    for model in (gpt, ernie):
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return {
        "gpt-tiny inference": bench_program("gpt_forward", gpt.eval(), batch, args, threads, export_dir, train=False),
        "ernie-tiny inference": bench_program("ernie_forward", ernie.eval(), batch, args, threads, export_dir,
                                              train=False),
        "gpt-tiny training step": bench_program("gpt_train", gpt.train(), batch, args, threads, export_dir,
                                                train=True),
    }


def main(argv: list[str] | None = None) -> dict:
    from rich.console import Console
    from rich.table import Table

    args = parse_args(argv)
    console = Console()
    threads = set_threads(args.threads)
    load_at_start = load_average()
    # A fresh inductor cache, so that the first call's compile time is a cold one.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="sampan-bench-inductor-")
    # ... and no compiled-graph cache at all: to_static and plain torch.compile often build the
    # same graph (the programs part has no tensor control flow), and with the cache on, whichever
    # compiles second would load the first one's kernels and report a first call of ~2 s.
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.autotune_local_cache = False
    torch._dynamo.reset()

    example = load_example()
    sampan.seed(SEED)
    model = sampan.models.create("gpt-tiny", hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                                 intermediate_size=4 * args.hidden, vocab_size=args.vocab,
                                 max_position_embeddings=args.prompt_len + args.new_tokens).eval()
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(SEED)
    prompts = {b: torch.randint(1, args.vocab, (b, args.prompt_len), generator=gen) for b in args.batches}
    with torch.no_grad():
        eos = pick_eos(example.make_generate(model, args.new_tokens, eos=-1, pad=0), prompts[args.batches[0]],
                       args.new_tokens)
    generate = example.make_generate(model, args.new_tokens, eos=eos, pad=0)
    static = sampan.jit.to_static(generate, backend=args.backend)  # full_graph=True
    counting = CountingBackend(args.backend)
    compiled = torch.compile(generate, backend=counting)
    export_dir = Path(tempfile.mkdtemp(prefix="sampan-bench-jit-"))

    # One export with a dynamic batch dimension serves every batch size. It is made first, from the
    # spec alone: after a batch-1 call, the example would be batch 1 and torch.export would
    # specialise the dimension to it.
    spec = [InputSpec([None, args.prompt_len], "int64", name="input_ids")]
    start = time.perf_counter()
    files = sampan.jit.save(static, export_dir / "generate", input_spec=spec)
    export = {"save_s": time.perf_counter() - start, "onnx_mb": files["onnx"].stat().st_size / 2**20}
    start = time.perf_counter()
    ort = sampan.jit.load(export_dir / "generate", backend="onnxruntime", num_threads=threads)
    export["load_s"] = time.perf_counter() - start

    first_call_s: dict[str, dict[str, float]] = {name: {} for name in ("to_static", "torch.compile")}
    rows, equal_work = [], {}
    for batch in args.batches:
        prompt = prompts[batch]
        with torch.no_grad():
            expected = generate(prompt)
            got = {"eager": expected}
            got["to_static"], first_call_s["to_static"][str(batch)] = timed_first_call(static, prompt)
            got["torch.compile"], first_call_s["torch.compile"][str(batch)] = timed_first_call(compiled, prompt)
            got["onnxruntime"] = ort(prompt)
        # Equal work: every contender generates the same tokens and stops at the same position.
        mismatched = {name: int((ids != expected[0]).sum()) if ids.shape == expected[0].shape else -1
                      for name, (ids, _) in got.items()}
        stopped = {name: int(cur) for name, (_, cur) in got.items()}
        if any(mismatched.values()) or len(set(stopped.values())) != 1:
            raise RuntimeError(f"batch {batch}: unequal work: mismatched tokens {mismatched}, stopped at {stopped}")
        equal_work[str(batch)] = {"mismatched_tokens": mismatched, "stopped_at": stopped,
                                  "max_position": args.prompt_len + args.new_tokens}

        runners = {"eager": generate, "to_static": static, "torch.compile": compiled, "onnxruntime": ort}

        def bound(fn, prompt=prompt):
            return lambda: fn(prompt)

        with torch.no_grad():
            timings = time_interleaved({name: bound(runners[name]) for name in CONTENDERS},
                                       steps=args.steps, repeats=args.repeats, warmup=args.warmup)
        eager_t = timings["eager"]
        sides = {name: t.as_dict() for name, t in timings.items()}
        speedup = {name: eager_t.median / timings[name].median for name in CONTENDERS if name != "eager"}
        paired = {name: statistics.median(e / s for e, s in zip(eager_t.per_step, timings[name].per_step, strict=True))
                  for name in CONTENDERS if name != "eager"}
        rows.append({"batch": batch, "stopped_at": int(expected[1]), "new_tokens": int(expected[1]) - args.prompt_len,
                     "sides": sides, "speedup_over_eager": speedup, "speedup_paired_median": paired})

    stats = static.stats()
    if stats["graph_breaks"] != 0:
        raise RuntimeError(f"to_static graph-broke: {stats}")
    programs = bench_programs(args, threads, export_dir)
    if any(row["graph_breaks"]["to_static"] for row in programs.values()):
        raise RuntimeError(f"to_static graph-broke: { {n: r['graph_breaks'] for n, r in programs.items()} }")
    result = {
        "benchmark": "to_static",
        "timestamp": timestamp(),
        "torch_version": torch.__version__,
        "threads": threads,
        "machine": machine_info(),
        "loadavg_at_start": load_at_start,
        "quick": args.quick,
        "model": {"name": "gpt-tiny", "hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                  "vocab": args.vocab, "params": params, "dtype": "float32"},
        "decode": {"prompt_len": args.prompt_len, "max_new_tokens": args.new_tokens, "eos": eos,
                   "program": "examples/jit_export.py make_generate (while loop, early exit on EOS)"},
        "backend": args.backend,
        "timing": {"steps_per_block": args.steps, "repeats": args.repeats, "warmup": args.warmup,
                   "interleaved": True, "unit": "one whole generation"},
        "equal_work": equal_work,
        "first_call_s": first_call_s,
        "onnx_export": export,
        "to_static_stats": stats,
        "torch_compile_graphs": counting.graphs,
        "batches": rows,
        "programs": programs,
        "programs_shape": {"batch": args.program_batch, "seq_len": args.seq_len, "hidden": args.hidden,
                           "layers": args.layers, "heads": args.heads, "vocab": args.vocab},
    }

    table = Table(title=f"ms per generation; xNAME = eager / NAME.  GPT greedy decode, early exit  h={args.hidden} L={args.layers} V={args.vocab} "
                        f"prompt {args.prompt_len} + up to {args.new_tokens}  fp32, {threads} threads, {args.backend}")
    table.add_column("batch", justify="right")
    table.add_column("tokens", justify="right")
    for name in CONTENDERS:
        table.add_column(SHORT[name], justify="right")
    for name in CONTENDERS[1:]:
        table.add_column(f"x{SHORT[name]}", justify="right")
    for row in rows:
        table.add_row(str(row["batch"]), str(row["new_tokens"]),
                      *(f"{row['sides'][n]['median_step_s'] * 1e3:.1f}" for n in CONTENDERS),
                      *(f"{row['speedup_over_eager'][n]:.2f}x" for n in CONTENDERS[1:]))
    console.print(table)
    console.print("first call (cold compile), s: " + "; ".join(
        f"{name} " + ", ".join(f"batch {b}: {s:.1f}" for b, s in per.items()) for name, per in first_call_s.items()))
    console.print(f"ONNX: jit.save {export['save_s']:.1f} s (.pt2 + .onnx), onnxruntime session {export['load_s']:.2f} s; "
                  f"to_static {stats}; plain torch.compile built {counting.graphs} graphs")
    table = Table(title=f"ms per step; xNAME = eager / NAME.  batch {args.program_batch} x {args.seq_len} tokens, "
                        f"h={args.hidden} L={args.layers}, fp32, {threads} threads, {args.backend}")
    for column in ("program", "eager", "static", "compile", "ORT", "xstatic", "xcompile", "xORT",
                   "first call static / compile (s)", "graphs static / compile", "breaks compile"):
        table.add_column(column, justify="left" if column == "program" else "right")
    for name, row in programs.items():
        sides, speed = row["sides"], row["speedup_over_eager"]
        table.add_row(name, *(f"{sides[n]['median_step_s'] * 1e3:.1f}" if n in sides else "-" for n in CONTENDERS),
                      *(f"{speed[n]:.2f}x" if n in speed else "-" for n in CONTENDERS[1:]),
                      f"{row['first_call_s']['to_static']:.1f} / {row['first_call_s']['torch.compile']:.1f}",
                      f"{row['graphs']['to_static']} / {row['graphs']['torch.compile']}",
                      str(row["graph_breaks"]["torch.compile"]))
    console.print(table)
    busy = [x for x in (load_at_start, result["machine"]["loadavg_1_5_15"]) if x and x[0] > 0.5]
    if busy:
        console.print(f"[yellow]note: 1-min load average was {max(x[0] for x in busy):.1f} on "
                      f"{os.cpu_count()} CPUs: other jobs were running, timings are noisy[/yellow]")
    if args.out is not None:
        path = write_json_atomic(args.out, result)
        console.print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()

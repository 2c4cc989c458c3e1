"""Hybrid parallelism measured: step time, tokens/s, bytes on the wire and bytes held, per layout.

One GPT, one global batch (``--batch`` sequences of ``--seq-len`` tokens, ``--micro`` micro-batches),
AdamW in fp32, run once as a plain single-process PyTorch loop (the baseline) and then under each
fleet layout on real gloo process groups (``torchrun``, one thread per rank). For every layout:

* **Time**: the median step time of ``--steps`` ``train_batch`` calls after ``--warmup``, the
  job's tokens/s, and the ratio to the baseline's tokens/s. On a 2-core machine more ranks cannot
  run faster than one process: this is the overhead side of the ledger, not a speed-up claim.
* **Communication**: every collective of one step, counted at the ``torch.distributed`` ops
  (``sampan.distributed.comm_counter.CommCounter``), as bytes each rank puts on the wire with ring
  algorithms (all-reduce ``2(n-1)/n`` x the buffer, all-gather / reduce-scatter ``(n-1)/n``, a
  send its size), summed over ranks, next to the closed-form volume of the layout:

  - data parallel: an all-reduce of the gradients, ``2(n-1)/n x 4Ψ'`` bytes per rank;
  - ZeRO 1/2 (sharding): reduce-scatter + all-gather, the same ``2(n-1)/n x 4Ψ'``;
  - ZeRO 3: two all-gathers and one reduce-scatter per micro-batch, ``3(n-1)/n x 4Ψ' x m``;
  - tensor parallel: 4 all-reduces of ``b·s·h`` per layer per micro-batch (2 forward, 2 backward),
    ``2(n-1)/n x 4 x 4·L'·b·s·h``, plus one ``b·s·h`` each for the vocabulary-parallel embedding
    (forward) and head (backward); sequence parallel moves the same as all-gathers and
    reduce-scatters;
  - pipeline: one ``b·s·h`` activation forward and one gradient backward per micro-batch and
    stage boundary, plus the tied embedding / head gradient all-reduce between first and last
    stage (the last stage's loss is vocabulary-parallel, as without a pipeline: only per-token
    statistics cross the mp ranks).

  Here ``Ψ' = Ψ_held / (mp·pp)`` is the parameters of one model slice (``Ψ_held`` counts the tied
  embedding table twice when there are pipeline stages), ``L'`` its layers, ``b`` the
  micro-batch on one data rank, ``m`` the micro-batches. Small scalar reductions (loss, token
  counts) are in the measured figure and not in the formula.
* **Memory**: parameter, gradient and optimizer-state bytes held per rank (local shards), next
  to the ZeRO paper's formulas for fp32 AdamW (4 + 4 + 8 bytes per parameter): stage 1 divides the
  optimizer state by the sharding degree N, stage 2 also the gradients, stage 3 also the
  parameters. FSDP2 keeps parameters sharded at rest at every stage (it gathers them per
  forward), so at rest sampan's stages 1 and 2 hold 4Ψ'/N of parameters, less than the formula.

    python benchmarks/hybrid_parallel.py                  # all layouts, writes benchmarks/results/hybrid_parallel.json
    python benchmarks/hybrid_parallel.py --quick --out /tmp/h.json     # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

# Benchmarks run as scripts (python benchmarks/NAME.py): their folder is on sys.path.
from _common import load_average, machine_info, timestamp, write_json_atomic

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "hybrid_parallel.json"
BYTES = 4  # fp32


@dataclass(frozen=True)
class Layout:
    name: str
    dp: int = 1
    mp: int = 1
    pp: int = 1
    sharding: int = 1
    stage: int = 1
    sp: bool = False

    @property
    def ranks(self) -> int:
        return self.dp * self.mp * self.pp * self.sharding


LAYOUTS = [
    Layout("dp2", dp=2),
    Layout("sharding2 (ZeRO-1)", sharding=2, stage=1),
    Layout("sharding2 (ZeRO-2)", sharding=2, stage=2),
    Layout("sharding2 (ZeRO-3)", sharding=2, stage=3),
    Layout("mp2", mp=2),
    Layout("mp2 + sequence parallel", mp=2, sp=True),
    Layout("pp2 (1F1B)", pp=2),
    Layout("dp2 x mp2", dp=2, mp=2),
    Layout("dp2 x pp2", dp=2, pp=2),
    Layout("mp2 x pp2", mp=2, pp=2),
    Layout("dp2 x mp2 x pp2", dp=2, mp=2, pp=2),
]
QUICK_LAYOUTS = ["dp2", "sharding2 (ZeRO-3)", "mp2", "pp2 (1F1B)"]


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    vocab: int
    seq_len: int
    batch: int
    micro: int


def build_model(shape: Shape):
    from sampan.models import create

    torch.manual_seed(0)
    return create("gpt-tiny", vocab_size=shape.vocab, hidden_size=shape.hidden, num_layers=shape.layers,
                  num_heads=shape.heads, max_position_embeddings=shape.seq_len, intermediate_size=4 * shape.hidden)


def global_batch(shape: Shape, step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, shape.vocab, (shape.batch, shape.seq_len), generator=gen)
    return {"input_ids": ids, "labels": ids}


# -- worker: one layout, under torchrun ----------------------------------------------------------

def _local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def run_worker(layout: Layout, shape: Shape, steps: int, warmup: int, out: Path) -> None:
    import torch.distributed as dist

    import sampan
    from sampan.distributed import fleet
    from sampan.distributed.comm_counter import CommCounter
    from sampan.distributed.env import shutdown

    torch.set_num_threads(1)
    model = build_model(shape)
    optimizer = sampan.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters(), weight_decay=0.01)
    strategy = fleet.DistributedStrategy(
        hybrid_configs={"dp_degree": layout.dp, "mp_degree": layout.mp, "pp_degree": layout.pp,
                        "sharding_degree": layout.sharding},
        sharding_configs={"stage": layout.stage}, pipeline_configs={"accumulate_steps": shape.micro},
        tensor_parallel_configs={"sequence_parallel": layout.sp})
    fleet.init(is_collective=True, strategy=strategy)
    dmodel = fleet.distributed_model(model)
    del model
    optimizer = fleet.distributed_optimizer(optimizer)
    params = [p for group in optimizer.param_groups for p in group["params"]]

    step = 0
    for _ in range(warmup):
        dmodel.train_batch(fleet.shard_batch(global_batch(shape, step)), optimizer)
        step += 1
    # One step in pieces: gradients are measured where they are complete, before the update.
    with CommCounter() as comm:
        loss = dmodel.forward_backward(fleet.shard_batch(global_batch(shape, step)))
        grad_bytes = _local_bytes(p.grad for p in params)
        optimizer.step()
        optimizer.clear_grad(set_to_zero=False)
    step += 1
    param_bytes = _local_bytes(params)
    state_bytes = _local_bytes(v for state in optimizer.torch_optimizer.state.values() for v in state.values()
                               if isinstance(v, torch.Tensor) and v.dim() > 0)
    times = []
    for _ in range(steps):
        batch = fleet.shard_batch(global_batch(shape, step))
        dist.barrier()
        start = time.perf_counter()
        dmodel.train_batch(batch, optimizer)
        times.append(time.perf_counter() - start)
        step += 1
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a step lasts until its slowest rank is done
    mine = {"comm": comm.totals(), "wire_bytes": comm.wire_bytes, "param_bytes": param_bytes,
            "grad_bytes": grad_bytes, "optimizer_bytes": state_bytes, "loss": float(loss)}
    ranks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    if dist.get_rank() == 0:
        out.write_text(json.dumps({"step_s": slowest.tolist(), "ranks": ranks}))
    shutdown()


# -- baseline: plain PyTorch, one process --------------------------------------------------------

def run_baseline(shape: Shape, steps: int, warmup: int, threads: int) -> dict[str, Any]:
    """The same model, batch and micro-batching as a hand-written torch loop with torch.optim.AdamW."""
    torch.set_num_threads(threads)
    model = build_model(shape).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)

    def train_step(step: int) -> float:
        batch = global_batch(shape, step)
        total = 0.0
        for part in range(shape.micro):
            size = shape.batch // shape.micro
            ids = batch["input_ids"][part * size:(part + 1) * size]
            loss = model(ids, labels=ids) / shape.micro
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total

    losses = [train_step(step) for step in range(warmup + 1)]
    times = []
    for step in range(warmup + 1, warmup + 1 + steps):
        start = time.perf_counter()
        train_step(step)
        times.append(time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters())
    return {"step_s": times, "threads": threads, "losses": losses, "parameters": params}


# -- closed forms --------------------------------------------------------------------------------

def held_parameters(layout: Layout, shape: Shape, params: int) -> float:
    """Parameters one model replica holds: with pipelines the tied embedding / head table is held
    twice (first and last stage, as Megatron does)."""
    return params + (shape.vocab * shape.hidden if layout.pp > 1 else 0)


def closed_form_wire_bytes(layout: Layout, shape: Shape, params: int) -> dict[str, float]:
    """Bytes on the wire per step summed over all ranks, by parallel axis (see the module doc)."""
    slice_params = held_parameters(layout, shape, params) / (layout.mp * layout.pp)
    layers = shape.layers / layout.pp
    data_ranks = layout.dp * layout.sharding
    b = shape.batch // data_ranks // shape.micro  # sequences per micro-batch on one data rank
    bsh = b * shape.seq_len * shape.hidden * BYTES
    m = shape.micro
    ranks = layout.ranks
    out: dict[str, float] = {}
    if layout.dp > 1:
        n = layout.dp
        out["data parallel 2Ψ'"] = ranks * 2 * (n - 1) / n * BYTES * slice_params
    if layout.sharding > 1:
        n = layout.sharding
        factor = 3 * m if layout.stage == 3 else 2
        out[f"ZeRO-{layout.stage} {'3Ψ x m' if layout.stage == 3 else '2Ψ'}"] = (
            ranks * factor * (n - 1) / n * BYTES * slice_params)
    if layout.mp > 1:
        n = layout.mp
        blocks = ranks * 2 * (n - 1) / n * m * 4 * layers * bsh
        # The embedding's forward and the head's backward all-reduce: one each on every rank of the
        # first / last stage (the same ranks when pp is 1), i.e. 2 x (data ranks x mp) of them.
        edges = 2 * data_ranks * n * 2 * (n - 1) / n * m * bsh
        out["tensor parallel 4·L·b·s·h"] = blocks + edges
    if layout.pp > 1:
        boundaries = layout.pp - 1
        # Every mp rank of a stage sends its own (replicated) copy; each data shard its own batch.
        out["pipeline 2·b·s·h per micro-batch"] = data_ranks * layout.mp * boundaries * 2 * m * bsh
        tied = shape.vocab * shape.hidden * BYTES / layout.mp
        out["tied embedding sync"] = data_ranks * layout.mp * 2 * tied  # a 2-rank all-reduce: 2(n-1)/n = 1 each
    return out


def formula_memory(layout: Layout, shape: Shape, params: int) -> dict[str, float]:
    """Per-rank bytes of fp32 AdamW by the ZeRO paper: 4Ψ' params, 4Ψ' grads, 8Ψ' states."""
    slice_params = held_parameters(layout, shape, params) / (layout.mp * layout.pp)
    n = layout.sharding
    p, g, o = 4 * slice_params, 4 * slice_params, 8 * slice_params
    if n > 1:
        o /= n
        if layout.stage >= 2:
            g /= n
        if layout.stage == 3:
            p /= n
    return {"param_bytes": p, "grad_bytes": g, "optimizer_bytes": o}


# -- driver --------------------------------------------------------------------------------------

def run_layout(layout: Layout, shape: Shape, steps: int, warmup: int, timeout: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={layout.ranks}",
               __file__, "--worker", json.dumps(asdict(layout)), "--shape", json.dumps(asdict(shape)),
               "--steps", str(steps), "--warmup", str(warmup), "--out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        if run.returncode != 0 or not out.is_file():
            raise RuntimeError(f"layout {layout.name} failed:\n{run.stderr[-3000:]}")
        return json.loads(out.read_text())


def summarize(layout: Layout, shape: Shape, raw: dict[str, Any], params: int, baseline_tps: float) -> dict[str, Any]:
    ranks = raw["ranks"]
    step_s = statistics.median(raw["step_s"])
    tokens = shape.batch * shape.seq_len
    measured_wire = sum(r["wire_bytes"] for r in ranks)
    closed = closed_form_wire_bytes(layout, shape, params)
    closed_total = sum(closed.values())
    by_kind: dict[str, dict[str, float]] = {}
    for r in ranks:
        for kind, row in r["comm"].items():
            acc = by_kind.setdefault(kind, {"calls": 0, "payload_bytes": 0, "wire_bytes": 0.0})
            for key in acc:
                acc[key] += row[key]
    memory = {key: max(r[key] for r in ranks) for key in ("param_bytes", "grad_bytes", "optimizer_bytes")}
    formula = formula_memory(layout, shape, params)
    return {
        "layout": asdict(layout), "ranks": layout.ranks,
        "median_step_s": step_s, "step_s": raw["step_s"], "tokens_per_s": tokens / step_s,
        "tokens_per_s_vs_baseline": tokens / step_s / baseline_tps,
        "wire_bytes_per_step": {"measured": measured_wire, "closed_form": closed_total,
                                "measured_over_closed_form": measured_wire / closed_total if closed_total else None,
                                "closed_form_terms": closed, "measured_by_op": by_kind},
        "memory_bytes_per_rank": {"measured_max_over_ranks": memory, "formula": formula,
                                  "measured_over_formula": {k: memory[k] / formula[k] for k in memory}},
        "first_step_loss": ranks[0]["loss"],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    parser.add_argument("--micro", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per layout")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layouts", default="", help="comma-separated layout names (default: all)")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 4 layouts, 1 timed step: a smoke run")
    parser.add_argument("--out", default=None,
                        help="JSON output (default benchmarks/results/hybrid_parallel.json; none with --quick)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--shape", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.heads, args.vocab, args.seq_len = 32, 4, 4, 256, 32
        args.steps, args.warmup = 1, 1
        args.layouts = args.layouts or ",".join(QUICK_LAYOUTS)
    return args


def _mb(value: float) -> str:
    return f"{value / 2**20:.2f}"


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.worker:
        run_worker(Layout(**json.loads(args.worker)), Shape(**json.loads(args.shape)), args.steps, args.warmup,
                   Path(args.out))
        return None
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 160))  # the table has 11 columns
    shape = Shape(args.hidden, args.layers, args.heads, args.vocab, args.seq_len, args.batch, args.micro)
    names = [n.strip() for n in args.layouts.split(",") if n.strip()] if args.layouts else [x.name for x in LAYOUTS]
    known = {x.name: x for x in LAYOUTS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown layout(s) {unknown}; known: {list(known)}")
    load_at_start = load_average()
    threads = min(2, os.cpu_count() or 1)
    # The baseline runs before and after the layouts (other jobs on a small machine come and go);
    # the faster of the two is the reference, so the ratios never flatter the layouts.
    baseline = run_baseline(shape, args.steps, args.warmup, threads)
    raws = {}
    for name in names:
        console.print(f"running {name} ...")
        raws[name] = run_layout(known[name], shape, args.steps, args.warmup, 600)
    after = run_baseline(shape, args.steps, args.warmup, threads)
    base_step = min(statistics.median(baseline["step_s"]), statistics.median(after["step_s"]))
    baseline["step_s_after_layouts"] = after["step_s"]
    tokens = shape.batch * shape.seq_len
    baseline_tps = tokens / base_step
    params = baseline["parameters"]
    rows = [summarize(known[name], shape, raws[name], params, baseline_tps) for name in names]

    table = Table(title=f"GPT {params / 1e6:.1f}M params, global batch {shape.batch} x {shape.seq_len} tokens, "
                        f"{shape.micro} micro-batches, fp32 AdamW, gloo")
    for col in ("layout", "ranks", "step s", "tokens/s", "vs 1 proc", "wire MB/step", "closed form MB",
                "ratio", "params MB/rank", "grads MB/rank", "optim MB/rank"):
        table.add_column(col, justify="left" if col == "layout" else "right")
    table.add_row("1 process, plain PyTorch", "1", f"{base_step:.3f}", f"{baseline_tps:,.0f}", "1.00", "-", "-", "-",
                  _mb(4 * params), _mb(4 * params), _mb(8 * params))
    for row in rows:
        wire, mem = row["wire_bytes_per_step"], row["memory_bytes_per_rank"]
        measured, formula = mem["measured_max_over_ranks"], mem["formula"]
        table.add_row(row["layout"]["name"], str(row["ranks"]), f"{row['median_step_s']:.3f}",
                      f"{row['tokens_per_s']:,.0f}", f"{row['tokens_per_s_vs_baseline']:.2f}",
                      _mb(wire["measured"]), _mb(wire["closed_form"]),
                      f"{wire['measured_over_closed_form']:.3f}" if wire["measured_over_closed_form"] else "-",
                      *(f"{_mb(measured[k])} ({_mb(formula[k])})" for k in ("param_bytes", "grad_bytes",
                                                                          "optimizer_bytes")))
    console.print(table)
    console.print("memory cells: measured (formula). wire: bytes each rank sends with ring algorithms, summed "
                  "over ranks, for one step. The baseline is the faster of a run before and one after the layouts "
                  f"(1-min load average at start: {load_at_start[0] if load_at_start else 'unknown'}).")
    result = {
        "benchmark": "hybrid_parallel", "timestamp": timestamp(), "torch_version": torch.__version__,
        "machine": machine_info(), "loadavg_at_start": load_at_start, "quick": args.quick,
        "shape": asdict(shape), "parameters": params,
        "baseline": {**baseline, "median_step_s": base_step, "tokens_per_s": baseline_tps},
        "layouts": rows,
    }
    out = args.out or (None if args.quick else RESULTS)
    if out:
        console.print(f"wrote {write_json_atomic(out, result)}")
    return result


if __name__ == "__main__":
    main()

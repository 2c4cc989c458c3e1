"""The Trainer's per-step cost against a hand-written PyTorch loop, and what activation recompute buys.

Part 1, Trainer vs hand loop. One GPT config, one random-token ``TokenWindowDataset``, the same
work on both sides: fp32, no accumulation, ``torch.optim.AdamW(fused=True)`` (what sampan's AdamW
picks on CPU) with the Trainer's parameter groups (matrices decayed, biases and norms not), global
norm clipping at 1.0, and the Trainer's schedule (linear warmup, then linear decay to
``min_lr_ratio``) rebuilt as a ``LambdaLR``. The hand loop reads the dataset through
``torch.utils.data.DataLoader`` (same batch size, shuffled) and calls ``loss.item()`` once a step,
as the Trainer does. The Trainer runs as a user would: ``logging_steps`` 10, TensorBoard on,
``metrics.jsonl``, progress bar off, ``save_steps`` 0.

Equal work is checked before anything is timed: a short Trainer run records the batches it drew
(through a collator that wraps the default one) and the hand loop replays them from the same
initial weights; the per-step losses, the learning rates and the final weights must agree.

Timing method. ``Trainer.train`` owns its loop, so the hand loop runs *inside* it: a
``TrainerCallback`` timestamps every step (from the end of its own ``on_step_end`` call to the
start of the next one, so a Trainer step is everything the loop does for it: data, forward,
backward, clipping, optimizer, schedule, the built-in callbacks and, every 10th step, logging to
stdout / ``metrics.jsonl`` / TensorBoard), and after every ``block_steps`` Trainer steps (default
1) it runs as many hand-loop steps, each timed with ``perf_counter``. Trainer and hand steps thus
alternate (T H T H ...): on a shared 2-core machine a neighbour that takes a core slows a 2-thread
step several-fold for seconds at a time, and step-level alternation lets such bursts hit both
sides alike. Garbage is collected and frozen (``gc.freeze``) when training starts, so the
collector's automatic passes stay short. The first ``warmup_blocks`` blocks of each side are not
counted; the end-of-run checkpoint the Trainer always writes falls after the last timed step.
Reported: the median per-step time of each side and their ratio (the goal, <= 1.03), the ratio of
means (every logging step included, but also every load burst), and the median of the paired
ratios T_i / H_i (robust to bursts that outlast a pair). The Trainer's input-pipeline cost is its
own ``data_wait_pct`` from ``metrics.jsonl`` (time blocked on the loader as % of step time), from
the interleaved run (``num_workers=0``) and from a separate Trainer-only run at ``--workers``.

Part 2, recompute. GPT (causal LM) and ERNIE (``ErnieForMaskedLM``, 15% of positions labelled,
dropout as configured) at ``--rc-seq-len``, for recompute "none", "full" and "selective"
(``sampan.trainer.apply_recompute``), on three copies of one initial model.

* Activation memory: the bytes the forward pass leaves held for backward. One forward+backward
  runs under ``torch.profiler.profile(profile_memory=True)`` with the forward and the backward in
  marked ranges; the profiler's allocation events (address, size, time) are paired into
  lifetimes, and the figure is the sum of the allocations made during forward, still alive at its
  end, and freed during backward. Cross-check: the CPU allocator's own running total (each
  allocation event carries it) at the end of forward minus just before it. A third figure, the
  unique non-parameter storages an outer ``saved_tensors_hooks`` sees, is recorded to show why it
  is not used: it catches the block inputs checkpoint saves, but not the matmul / attention outputs
  selective checkpointing caches in its own storage, so for "selective" it reports the "full"
  figure (TORCH-FACTS, activation checkpointing).
* Equal work: the three modes start from the same weights and RNG seed, and must give the same
  loss and the same gradients in that profiled pass.
* Step time: forward + backward + fused AdamW step, the three modes in interleaved blocks
  (``_common.time_interleaved``), median per step; the overhead is the ratio of medians, and the
  median of per-repeat ratios is reported beside it.

Goals: full recompute saves >= 60% of activation memory for <= 40% more step time; selective is
reported beside it. Absolute times on a small shared CPU are noise; the ratios are the result.

Part 3, ``torch.compile`` (``TrainingArguments.compile``: ``sampan.nn.compile.apply_compile``,
each transformer block compiled after recompute). The part-1 GPT, eager against compiled, with
recompute "none" and "full", from the same weights. Compile time is reported on its own: the
first compiled step (dynamo tracing + inductor codegen + the C++ build, with a fresh, empty
inductor cache so it is the cold figure a first run pays) minus the median eager step. Equal work:
the first ``CHECK_STEPS`` losses of both sides agree to ``COMPILE_LOSS_TOL`` (inductor reorders
float arithmetic, so not bit for bit). Then fwd + bwd + fused AdamW steps, eager and compiled in
interleaved blocks (``time_interleaved``): the speed-up is the ratio of medians, and the
break-even is the steps after which the saved time has paid for the compile.

    python benchmarks/trainer.py                           # defaults, writes benchmarks/results/trainer.json
    python benchmarks/trainer.py --quick --out /tmp/t.json # smoke run, under a minute
    python benchmarks/trainer.py --only-compile            # part 3 alone -> results/trainer_compile.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

# Benchmarks run as scripts (python benchmarks/NAME.py): their folder is on sys.path.
from _common import (
    apply_presets,
    load_average,
    machine_info,
    set_threads,
    time_interleaved,
    timestamp,
    write_json_atomic,
)
from sampan.io import TokenWindowDataset, default_collate
from sampan.models import registry
from sampan.nn.compile import apply_compile
from sampan.trainer import Trainer, TrainerCallback, TrainingArguments, apply_recompute

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "trainer.json"
DEFAULTS = dict(hidden=256, layers=4, heads=4, vocab=8192, seq_len=256, batch=4, block_steps=1, blocks=60,
                warmup_blocks=5, logging_steps=10, workers=2, worker_steps=30, rc_hidden=256, rc_layers=4, rc_heads=4,
                rc_seq_len=512, rc_batch=4, rc_gpt_vocab=8192, rc_ernie_vocab=21128, rc_repeats=7,
                compile_repeats=15)
QUICK = dict(hidden=32, layers=2, heads=2, vocab=128, seq_len=16, batch=2, block_steps=1, blocks=6,
             warmup_blocks=2, logging_steps=2, workers=1, worker_steps=6, rc_hidden=32, rc_layers=2, rc_heads=2,
             rc_seq_len=32, rc_batch=2, rc_gpt_vocab=128, rc_ernie_vocab=128, rc_repeats=2, compile_repeats=2)
SEED = 1234
LR, BETAS, EPS, WEIGHT_DECAY, MAX_GRAD_NORM = 3e-4, (0.9, 0.95), 1e-8, 0.01, 1.0
WARMUP_STEPS, MIN_LR_RATIO = 5, 0.1
CHECK_STEPS = 3
LOSS_TOL, PARAM_TOL, LR_TOL = 1e-5, 1e-5, 1e-12
RC_LOSS_TOL, RC_GRAD_TOL = 1e-5, 1e-5  # gradients: max |diff| relative to max |grad|
COMPILE_LOSS_TOL = 1e-4  # relative; inductor's fused kernels sum in another order
MLM_RATIO = 0.15
GOALS = {"trainer_ratio_max": 1.03, "data_wait_pct_max": 2.0, "full_saving_pct_min": 60.0,
         "full_overhead_pct_max": 40.0}
FWD_MARK, BWD_MARK = "sampan_bench::forward", "sampan_bench::backward"


# --- shared pieces -----------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    d = DEFAULTS
    g = parser.add_argument_group("part 1: Trainer vs hand-written loop (GPT)")
    g.add_argument("--hidden", type=int, help=f"hidden size (default {d['hidden']})")
    g.add_argument("--layers", type=int, help=f"transformer blocks (default {d['layers']})")
    g.add_argument("--heads", type=int, help=f"attention heads (default {d['heads']})")
    g.add_argument("--vocab", type=int, help=f"vocabulary size (default {d['vocab']})")
    g.add_argument("--seq-len", type=int, help=f"sequence length (default {d['seq_len']})")
    g.add_argument("--batch", type=int, help=f"batch size (default {d['batch']})")
    g.add_argument("--block-steps", type=int, help=f"steps per interleaved block (default {d['block_steps']})")
    g.add_argument("--blocks", type=int, help=f"timed blocks per side (default {d['blocks']})")
    g.add_argument("--warmup-blocks", type=int, help=f"untimed blocks per side first (default {d['warmup_blocks']})")
    g.add_argument("--logging-steps", type=int, help=f"Trainer logging_steps (default {d['logging_steps']})")
    g.add_argument("--workers", type=int, help=f"dataloader_num_workers of the data-wait run (default {d['workers']})")
    g.add_argument("--worker-steps", type=int, help=f"steps of the data-wait run (default {d['worker_steps']})")
    r = parser.add_argument_group("part 2: activation recompute (GPT and ERNIE)")
    r.add_argument("--rc-hidden", type=int, help=f"hidden size (default {d['rc_hidden']})")
    r.add_argument("--rc-layers", type=int, help=f"transformer blocks (default {d['rc_layers']})")
    r.add_argument("--rc-heads", type=int, help=f"attention heads (default {d['rc_heads']})")
    r.add_argument("--rc-seq-len", type=int, help=f"sequence length (default {d['rc_seq_len']})")
    r.add_argument("--rc-batch", type=int, help=f"batch size (default {d['rc_batch']})")
    r.add_argument("--rc-gpt-vocab", type=int, help=f"GPT vocabulary (default {d['rc_gpt_vocab']})")
    r.add_argument("--rc-ernie-vocab", type=int, help=f"ERNIE vocabulary (default {d['rc_ernie_vocab']})")
    r.add_argument("--rc-repeats", type=int, help=f"timed steps per mode, interleaved (default {d['rc_repeats']})")
    c = parser.add_argument_group("part 3: torch.compile (the part-1 GPT)")
    c.add_argument("--compile-repeats", type=int,
                   help=f"timed steps per side, interleaved (default {d['compile_repeats']})")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--only-compile", action="store_true",
                        help="run part 3 alone and write it to benchmarks/results/trainer_compile.json "
                             "(or --out): rerun compile figures without parts 1 and 2")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes and few steps (smoke test); writes JSON only when --out is given")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default benchmarks/results/trainer.json; none with --quick)")
    args = parser.parse_args(argv)
    default_out = DEFAULT_OUT.with_name("trainer_compile.json") if args.only_compile else DEFAULT_OUT
    return apply_presets(args, QUICK if args.quick else DEFAULTS, None if args.quick else default_out)


def load_note(loads: list[list[float] | None], cpus: int) -> tuple[bool, str | None]:
    """Whether other jobs were running. The load at start is other jobs only; later samples include
    this benchmark's own threads, so they count as high only above the CPU count."""
    start, *later = loads
    high_start = start is not None and start[0] > 0.5
    high_later = any(x is not None and x[0] > cpus + 0.5 for x in later)
    if not (high_start or high_later):
        return False, None
    worst = max(x[0] for x in loads if x is not None)
    return True, (f"1-min load average reached {worst:.1f} on {cpus} CPUs ({start[0] if start else '?'} at start, "
                  "before any of this benchmark's work): the machine was shared or had just been busy; timings "
                  "are noisy, trust the interleaved ratios over absolute times")


def median_or_nan(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# --- part 1: Trainer vs a hand-written loop -----------------------------------------------------
def lr_multiplier(step: int, max_steps: int) -> float:
    """The Trainer's "linear" schedule (``schedules.build_schedule``) as a LambdaLR factor."""
    warmup = min(WARMUP_STEPS, max_steps)
    if step < warmup:
        return step / warmup
    after = max(1, max_steps - warmup)
    progress = min(step - warmup, after) / after
    return 1.0 + (MIN_LR_RATIO - 1.0) * progress


def hand_optimizer(model: torch.nn.Module, max_steps: int):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_multiplier(step, max_steps))
    return opt, sched


def hand_step(model, opt, sched, batch: dict[str, torch.Tensor]) -> float:
    loss = model(**batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def forever(loader) -> Iterator[Any]:
    while True:
        yield from loader


def training_args(output_dir: Path, max_steps: int, **overrides: Any) -> TrainingArguments:
    kwargs = dict(output_dir=str(output_dir), max_steps=max_steps, learning_rate=LR, lr_scheduler="linear",
                  warmup_steps=WARMUP_STEPS, min_lr_ratio=MIN_LR_RATIO, weight_decay=WEIGHT_DECAY,
                  adam_beta1=BETAS[0], adam_beta2=BETAS[1], adam_epsilon=EPS, max_grad_norm=MAX_GRAD_NORM,
                  amp=None, recompute="none", seed=SEED, save_steps=0,
                  dataloader_num_workers=0, progress_bar=False, tensorboard=True)
    kwargs.update(overrides)
    return TrainingArguments(**kwargs)


def read_metrics(output_dir: Path) -> list[dict[str, Any]]:
    path = output_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def quiet():
    """Trainer log lines go to a buffer (they are still formatted, as on a terminal), not the table."""
    return contextlib.redirect_stdout(io.StringIO())


def check_equal_work(base: torch.nn.Module, dataset, batch: int, workdir: Path) -> dict[str, Any]:
    """A short Trainer run and the hand loop replaying its batches must agree step for step."""
    recorded: list[dict[str, torch.Tensor]] = []

    def recording_collate(samples):
        out = default_collate(samples)
        recorded.append({k: v.clone() for k, v in out.items()})
        return out

    out_dir = workdir / "equal_work"
    args = training_args(out_dir, CHECK_STEPS, per_device_train_batch_size=batch, logging_steps=1,
                         tensorboard=False, peak_flops=0)
    trainer = Trainer(copy.deepcopy(base), args, dataset, data_collator=recording_collate)
    inner = trainer.optimizer.torch_optimizer
    hand = copy.deepcopy(base)
    opt, sched = hand_optimizer(hand, CHECK_STEPS)
    problems = []
    if type(inner) is not torch.optim.AdamW or not inner.defaults.get("fused"):
        problems.append(f"Trainer optimizer is {type(inner).__name__} fused={inner.defaults.get('fused')}")
    groups = lambda o: [(len(g["params"]), sum(p.numel() for p in g["params"]), g["weight_decay"],  # noqa: E731
                         tuple(g["betas"]), g["eps"]) for g in o.param_groups]
    if groups(inner) != groups(opt):
        problems.append(f"param groups differ: Trainer {groups(inner)}, hand {groups(opt)}")
    with quiet():
        trainer.train()
    metrics = [m for m in read_metrics(out_dir) if m.get("kind") == "train"]
    trainer_losses = [m["loss"] for m in metrics]
    trainer_lrs = [m["lr"] for m in metrics]
    if len(recorded) != CHECK_STEPS:
        problems.append(f"Trainer drew {len(recorded)} batches for {CHECK_STEPS} steps")
    hand_losses, hand_lrs = [], []
    for b in recorded[:CHECK_STEPS]:
        hand_lrs.append(opt.param_groups[0]["lr"])  # the rate this step uses (what the Trainer logs)
        hand_losses.append(hand_step(hand, opt, sched, b))
    loss_diff = max(abs(a - b) for a, b in zip(trainer_losses, hand_losses, strict=True))
    lr_diff = max(abs(a - b) for a, b in zip(trainer_lrs, hand_lrs, strict=True))
    param_diff = max((a - b).abs().max().item()
                     for a, b in zip(trainer.model.parameters(), hand.parameters(), strict=True))
    n_params = sum(p.numel() for p in base.parameters())
    if loss_diff > LOSS_TOL:
        problems.append(f"losses differ by {loss_diff:.3g}: Trainer {trainer_losses}, hand {hand_losses}")
    if lr_diff > LR_TOL:
        problems.append(f"learning rates differ by {lr_diff:.3g}: Trainer {trainer_lrs}, hand {hand_lrs}")
    if param_diff > PARAM_TOL:
        problems.append(f"weights after {CHECK_STEPS} steps differ by {param_diff:.3g}")
    if problems:
        raise RuntimeError("Trainer and hand loop do unequal work: " + "; ".join(problems))
    return {"steps": CHECK_STEPS, "params": n_params, "losses_trainer": trainer_losses, "losses_hand": hand_losses,
            "loss_max_abs_diff": loss_diff, "lr_max_abs_diff": lr_diff, "param_max_abs_diff": param_diff,
            "tolerances": {"loss": LOSS_TOL, "lr": LR_TOL, "param": PARAM_TOL},
            "optimizer": "torch.optim.AdamW(fused=True), groups [matrices decayed, vectors not]"}


class StepClock(TrainerCallback):
    """Per-step wall time of the Trainer loop; optionally runs a hand-loop block every ``every`` steps."""

    def __init__(self, every: int = 0, hand_block: Callable[[], list[float]] | None = None):
        self.every, self.hand_block = every, hand_block
        self.trainer_steps: list[float] = []
        self.hand_steps: list[float] = []
        self._last = 0.0

    def on_train_begin(self, args, state):
        # Everything built so far (models, modules, tensorboard) moves to the permanent generation,
        # so the collector's automatic passes during the run stay short and land on both sides alike.
        gc.collect()
        gc.freeze()
        self._last = time.perf_counter()

    def on_step_end(self, args, state):
        self.trainer_steps.append(time.perf_counter() - self._last)
        if self.hand_block is not None and state.global_step % self.every == 0:
            self.hand_steps.extend(self.hand_block())
        self._last = time.perf_counter()


def data_wait(metrics: list[dict[str, Any]], logging_steps: int) -> dict[str, Any]:
    windows = [m for m in metrics if m.get("kind") == "train"]
    pcts = [m["data_wait_pct"] for m in windows]
    return {"per_window_pct": pcts, "steady_median_pct": median_or_nan(pcts[1:]),
            "first_window_pct": pcts[0] if pcts else float("nan"),
            "all_windows_mean_pct": statistics.fmean(pcts) if pcts else float("nan"),
            "steps_per_window": logging_steps,
            "note": "first window holds the loader iterator start (and worker start-up); steady = later windows"}


def block_means(per_step: list[float], block: int) -> list[float]:
    return [statistics.fmean(per_step[i:i + block]) for i in range(0, len(per_step) - block + 1, block)]


def part_trainer(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    config = registry.get_config("gpt-tiny", hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                                 vocab_size=args.vocab, max_position_embeddings=args.seq_len,
                                 intermediate_size=4 * args.hidden)
    torch.manual_seed(SEED)
    base = registry.create(config).train()
    total_steps = (args.warmup_blocks + args.blocks) * args.block_steps
    windows = 2 * max(total_steps, args.worker_steps) * args.batch + 8  # no epoch boundary inside a run
    rng = np.random.default_rng(SEED)
    tokens = rng.integers(0, args.vocab, size=windows * args.seq_len, dtype=np.int64).astype(
        np.uint16 if args.vocab <= 65536 else np.uint32)
    dataset = TokenWindowDataset(tokens, seq_len=args.seq_len)

    equal = check_equal_work(base, dataset, args.batch, workdir)

    # The timed run: Trainer blocks and hand blocks alternate (see the module docstring).
    hand = copy.deepcopy(base)
    opt, sched = hand_optimizer(hand, total_steps)
    hand_batches = forever(torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True,
                                                       drop_last=True, num_workers=0))

    def hand_block() -> list[float]:
        times = []
        for _ in range(args.block_steps):
            start = time.perf_counter()
            hand_step(hand, opt, sched, next(hand_batches))
            times.append(time.perf_counter() - start)
        return times

    clock = StepClock(args.block_steps, hand_block)
    out_dir = workdir / "timed"
    trainer = Trainer(copy.deepcopy(base), training_args(out_dir, total_steps, per_device_train_batch_size=args.batch,
                                                         logging_steps=args.logging_steps),
                      dataset, callbacks=[clock])
    t0 = time.perf_counter()
    with quiet():
        trainer.train()
    wall = time.perf_counter() - t0
    skip = args.warmup_blocks * args.block_steps
    t_steps, h_steps = clock.trainer_steps[skip:], clock.hand_steps[skip:]
    if len(t_steps) != len(h_steps) or not t_steps:
        raise RuntimeError(f"unequal step counts: Trainer {len(t_steps)}, hand {len(h_steps)}")
    t_blocks, h_blocks = block_means(t_steps, args.block_steps), block_means(h_steps, args.block_steps)
    wait0 = data_wait(read_metrics(out_dir), args.logging_steps)

    # The data-wait run with worker processes (Trainer only).
    wclock = StepClock()
    w_dir = workdir / f"workers{args.workers}"
    w_trainer = Trainer(copy.deepcopy(base), training_args(w_dir, args.worker_steps, per_device_train_batch_size=args.batch,
                                                           logging_steps=args.logging_steps,
                                                           dataloader_num_workers=args.workers),
                        dataset, callbacks=[wclock])
    with quiet():
        w_trainer.train()
    waitw = data_wait(read_metrics(w_dir), args.logging_steps)
    w_skip = min(args.logging_steps, len(wclock.trainer_steps) - 1)
    waitw["median_step_s"] = statistics.median(wclock.trainer_steps[w_skip:])
    waitw["note"] += "; median_step_s from a Trainer-only run, not interleaved with the hand loop"
    wait0["median_step_s"] = statistics.median(t_steps)

    def side(steps: list[float], blocks: list[float]) -> dict[str, Any]:
        out = {"median_step_s": statistics.median(steps), "mean_step_s": statistics.fmean(steps),
               "min_step_s": min(steps), "per_step_s": steps}
        if args.block_steps > 1:
            out.update(median_block_mean_s=statistics.median(blocks), per_block_mean_s=blocks)
        return out

    tr, hd = side(t_steps, t_blocks), side(h_steps, h_blocks)
    ratio = tr["median_step_s"] / hd["median_step_s"]
    steady = [wait0["steady_median_pct"], waitw["steady_median_pct"]]
    return {
        "config": {"model": "gpt-tiny", "hidden": args.hidden, "layers": args.layers, "heads": args.heads,
                   "vocab": args.vocab, "seq_len": args.seq_len, "batch": args.batch,
                   "intermediate": config.intermediate_size, "dtype": "float32", "params": equal["params"],
                   "dataset_windows": len(dataset)},
        "training": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WEIGHT_DECAY,
                     "max_grad_norm": MAX_GRAD_NORM, "schedule": "linear", "warmup_steps": WARMUP_STEPS,
                     "min_lr_ratio": MIN_LR_RATIO, "gradient_accumulation_steps": 1,
                     "trainer": {"logging_steps": args.logging_steps, "tensorboard": True, "progress_bar": False,
                                 "save_steps": 0, "dataloader_num_workers": 0}},
        "timing": {"method": "hand blocks run inside the Trainer loop from a TrainerCallback, alternating "
                             "with Trainer blocks; per-step perf_counter; first warmup_blocks of each side dropped",
                   "block_steps": args.block_steps, "blocks": args.blocks, "warmup_blocks": args.warmup_blocks,
                   "steps_timed_per_side": len(t_steps), "run_wall_s": wall},
        "equal_work": equal,
        "trainer": tr,
        "hand": hd,
        "ratio_median_step": ratio,
        "ratio_mean_step": tr["mean_step_s"] / hd["mean_step_s"],
        "ratio_paired_median": statistics.median(a / b for a, b in zip(t_blocks, h_blocks, strict=True)),
        "ratio_goal": GOALS["trainer_ratio_max"],
        "ratio_goal_met": ratio <= GOALS["trainer_ratio_max"],
        "data_wait": {"workers_0": wait0, f"workers_{args.workers}": waitw,
                      "goal_pct": GOALS["data_wait_pct_max"],
                      "goal_met": all(x <= GOALS["data_wait_pct_max"] for x in steady)},
    }


# --- part 2: activation recompute ----------------------------------------------------------------
def _walk(nodes):
    for node in nodes:
        yield node
        yield from _walk(node.children)


def activation_memory(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[dict[str, float], float]:
    """One profiled forward+backward; returns (memory figures in bytes, loss). See the module docstring."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    hooked: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in param_ptrs:
            hooked[storage.data_ptr()] = storage.nbytes()
        return t

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function(FWD_MARK), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model(**batch)
        with record_function(BWD_MARK):
            loss.backward()
    nodes = list(_walk(prof.profiler.kineto_results.experimental_event_tree()))
    fwd = next(n for n in nodes if n.name == FWD_MARK)
    bwd = next(n for n in nodes if n.name == BWD_MARK)
    allocs = sorted((n for n in nodes if n.tag == _EventType.Allocation), key=lambda n: n.start_time_ns)
    if not allocs:
        raise RuntimeError("the profiler recorded no allocation events (profile_memory=True)")
    f0, f1, b1 = fwd.start_time_ns, fwd.end_time_ns, bwd.end_time_ns
    live: dict[int, tuple[int, int]] = {}
    held = alive_at_end = 0
    for n in allocs:
        f = n.extra_fields
        if f.alloc_size > 0:
            live[f.ptr] = (n.start_time_ns, f.alloc_size)
        elif f.ptr in live:
            t_alloc, size = live.pop(f.ptr)
            if f0 <= t_alloc <= f1 < n.start_time_ns:
                alive_at_end += size
                if n.start_time_ns <= b1:
                    held += size
    alive_at_end += sum(size for t_alloc, size in live.values() if f0 <= t_alloc <= f1)
    before = [n for n in allocs if n.start_time_ns < f0]
    first_in = next(n for n in allocs if n.start_time_ns >= f0)
    base_total = (before[-1].extra_fields.total_allocated if before
                  else first_in.extra_fields.total_allocated - first_in.extra_fields.alloc_size)
    end_total = [n for n in allocs if n.start_time_ns <= f1][-1].extra_fields.total_allocated
    peak = max(n.extra_fields.total_allocated for n in allocs if n.start_time_ns >= f0)
    return {"held_for_backward": held, "alive_at_forward_end": alive_at_end,
            "allocator_total_delta": end_total - base_total, "peak_above_start": peak - base_total,
            "outer_saved_tensors_hooks": sum(hooked.values())}, loss.item()


def mlm_batch(vocab: int, batch: int, seq: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, vocab, (batch, seq), generator=gen)  # 0 is [PAD]
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(batch, seq, generator=gen) < MLM_RATIO
    labels[chosen] = ids[chosen]
    return {"input_ids": ids, "labels": labels}


def recompute_one(name: str, base: torch.nn.Module, batch: dict[str, torch.Tensor], repeats: int) -> dict[str, Any]:
    modes = ("none", "full", "selective")
    models = {}
    for mode in modes:
        m = copy.deepcopy(base).train()
        wrapped = apply_recompute(m, mode)
        models[mode] = m
        if mode != "none" and wrapped == 0:
            raise RuntimeError(f"{name}: apply_recompute wrapped no blocks")
    mem, losses = {}, {}
    for mode, m in models.items():
        m(**batch).backward()  # warm-up: first-call allocations are not activations
        m.zero_grad(set_to_none=True)
        torch.manual_seed(SEED)  # the same dropout masks in every mode
        mem[mode], losses[mode] = activation_memory(m, batch)
    # Equal work: same loss and the same gradients from the same weights and seed.
    ref = dict(models["none"].named_parameters())
    scale = max(p.grad.abs().max().item() for p in ref.values() if p.grad is not None)
    grad_diff, loss_diff = {}, {}
    for mode in modes[1:]:
        loss_diff[mode] = abs(losses[mode] - losses["none"])
        grad_diff[mode] = max((p.grad - ref[k].grad).abs().max().item()
                              for k, p in models[mode].named_parameters() if p.grad is not None) / scale
        if loss_diff[mode] > RC_LOSS_TOL or grad_diff[mode] > RC_GRAD_TOL:
            raise RuntimeError(f"{name} recompute={mode} differs from none: loss by {loss_diff[mode]:.3g}, "
                               f"gradients by {grad_diff[mode]:.3g} of max |grad|")
    steps = {}
    for mode, m in models.items():
        m.zero_grad(set_to_none=True)
        opt = torch.optim.AdamW(m.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True)

        def step(m=m, opt=opt):
            m(**batch).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        steps[mode] = step
    timings = time_interleaved(steps, steps=1, repeats=repeats, warmup=1)
    none_mem, none_t = mem["none"]["held_for_backward"], timings["none"].median
    out_modes = {}
    for mode in modes:
        held = mem[mode]["held_for_backward"]
        out_modes[mode] = {
            "activation_mib": held / 2**20,
            "allocator_total_delta_mib": mem[mode]["allocator_total_delta"] / 2**20,
            "alive_at_forward_end_mib": mem[mode]["alive_at_forward_end"] / 2**20,
            "peak_above_start_mib": mem[mode]["peak_above_start"] / 2**20,
            "outer_saved_tensors_hooks_mib": mem[mode]["outer_saved_tensors_hooks"] / 2**20,
            "saving_pct": 100.0 * (1 - held / none_mem),
            **timings[mode].as_dict(),
            "overhead_pct": 100.0 * (timings[mode].median / none_t - 1),
            # Per repeat the modes run back to back, so a per-repeat ratio cancels slower drifts.
            "overhead_pct_paired_median": 100.0 * (statistics.median(
                a / b for a, b in zip(timings[mode].per_step, timings["none"].per_step, strict=True)) - 1),
            "loss": losses[mode],
        }
    cross = max(abs(mem[m]["allocator_total_delta"] - mem[m]["held_for_backward"]) / max(mem[m]["held_for_backward"], 1)
                for m in modes)
    return {"modes": out_modes,
            "equal_work": {"loss_abs_diff_vs_none": loss_diff, "grad_max_diff_rel_vs_none": grad_diff,
                           "tolerances": {"loss": RC_LOSS_TOL, "grad_rel": RC_GRAD_TOL}},
            "memory_cross_check_max_rel_diff": cross,
            "full_goal_met": (out_modes["full"]["saving_pct"] >= GOALS["full_saving_pct_min"]
                              and out_modes["full"]["overhead_pct"] <= GOALS["full_overhead_pct_max"])}


def part_recompute(args: argparse.Namespace) -> dict[str, Any]:
    h, layers, heads, seq, b = args.rc_hidden, args.rc_layers, args.rc_heads, args.rc_seq_len, args.rc_batch
    gen = torch.Generator().manual_seed(SEED)
    gpt_cfg = registry.get_config("gpt-tiny", hidden_size=h, num_layers=layers, num_heads=heads,
                                  vocab_size=args.rc_gpt_vocab, max_position_embeddings=seq, intermediate_size=4 * h)
    ernie_cfg = registry.get_config("ernie-tiny", hidden_size=h, num_layers=layers, num_heads=heads,
                                    vocab_size=args.rc_ernie_vocab, max_position_embeddings=max(512, seq),
                                    intermediate_size=4 * h)
    ids = torch.randint(0, args.rc_gpt_vocab, (b, seq), generator=gen)
    mlm = mlm_batch(args.rc_ernie_vocab, b, seq, gen)
    # ERNIE as configured (dropout 0.1, as BERT pretrains), and the same model without dropout: the
    # dropout masks' random numbers are recomputed too, and on CPU they are a large part of a step.
    ernie_nodrop = ernie_cfg.replace(dropout=0.0, attention_dropout=0.0)
    out = {}
    for name, cfg, batch in (("gpt", gpt_cfg, {"input_ids": ids, "labels": ids}),
                             ("ernie", ernie_cfg, mlm),
                             ("ernie_dropout0", ernie_nodrop, mlm)):
        torch.manual_seed(SEED)
        model = registry.create(cfg).train()
        result = recompute_one(name, model, batch, args.rc_repeats)
        result["config"] = {"model": f"{name.split('_')[0]}-tiny", "hidden": h, "layers": layers, "heads": heads, "seq_len": seq,
                            "batch": b, "vocab": cfg.vocab_size, "intermediate": 4 * h,
                            "dropout": getattr(cfg, "dropout", 0.0),
                            "attention_dropout": getattr(cfg, "attention_dropout", 0.0), "dtype": "float32",
                            "params": sum(p.numel() for p in model.parameters()),
                            **({"masked_positions": int((batch["labels"] != -100).sum())} if name.startswith("ernie") else {})}
        out[name] = result
    return out


# --- part 3: torch.compile -----------------------------------------------------------------------
def compile_one(base: torch.nn.Module, batch: dict[str, torch.Tensor], recompute: str, repeats: int,
                cache_dir: Path) -> dict[str, Any]:
    """Eager against per-block compiled ``base`` (both with ``recompute``): compile time, equal
    work, interleaved step times."""
    import torch._dynamo

    torch._dynamo.reset()  # no graph of an earlier configuration is reused
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)  # empty: the cold compile a first run pays
    sides: dict[str, Any] = {}
    for side in ("eager", "compiled"):
        model = copy.deepcopy(base).train()
        apply_recompute(model, recompute)
        if side == "compiled" and apply_compile(model) == 0:
            raise RuntimeError("apply_compile compiled no blocks")
        opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                fused=True)

        def step(model=model, opt=opt) -> float:
            loss = model(**batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss.detach())

        sides[side] = step
    losses: dict[str, list[float]] = {"eager": [], "compiled": []}
    first: dict[str, float] = {}
    for side, step in sides.items():  # the same steps from the same weights: equal work
        for i in range(CHECK_STEPS):
            start = time.perf_counter()
            losses[side].append(step())
            if i == 0:
                first[side] = time.perf_counter() - start
    diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses["compiled"], losses["eager"], strict=True))
    if diff > COMPILE_LOSS_TOL:
        raise RuntimeError(f"compiled (recompute={recompute}) differs from eager: losses {losses['compiled']} "
                           f"against {losses['eager']} (relative {diff:.3g} > {COMPILE_LOSS_TOL})")
    timings = time_interleaved(sides, steps=1, repeats=repeats, warmup=1)
    eager, compiled = timings["eager"].median, timings["compiled"].median
    compile_s = first["compiled"] - eager
    saved = eager - compiled
    return {
        "recompute": recompute,
        "compile_s": compile_s,
        "first_step_s": first,
        "eager": timings["eager"].as_dict(),
        "compiled": timings["compiled"].as_dict(),
        "speedup_median_step": eager / compiled,
        "speedup_paired_median": statistics.median(
            a / b for a, b in zip(timings["eager"].per_step, timings["compiled"].per_step, strict=True)),
        "break_even_steps": compile_s / saved if saved > 0 else None,
        "equal_work": {"losses_eager": losses["eager"], "losses_compiled": losses["compiled"],
                       "max_rel_diff": diff, "tolerance": COMPILE_LOSS_TOL},
    }


def part_compile(args: argparse.Namespace) -> dict[str, Any]:
    h, layers, heads, seq, b = args.hidden, args.layers, args.heads, args.seq_len, args.batch
    cfg = registry.get_config("gpt-tiny", hidden_size=h, num_layers=layers, num_heads=heads, vocab_size=args.vocab,
                              max_position_embeddings=seq, intermediate_size=4 * h)
    gen = torch.Generator().manual_seed(SEED)
    ids = torch.randint(0, args.vocab, (b, seq), generator=gen)
    torch.manual_seed(SEED)
    base = registry.create(cfg).train()
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    out: dict[str, Any] = {"config": {"model": "gpt-tiny", "hidden": h, "layers": layers, "heads": heads,
                                      "seq_len": seq, "batch": b, "vocab": args.vocab, "dtype": "float32",
                                      "params": sum(p.numel() for p in base.parameters())}}
    try:
        for recompute in ("none", "full"):
            with tempfile.TemporaryDirectory(prefix="sampan-bench-inductor-") as cache:
                out[f"recompute_{recompute}"] = compile_one(base, {"input_ids": ids, "labels": ids}, recompute,
                                                            args.compile_repeats, Path(cache))
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    return out


def print_compile_table(console, p3: dict[str, Any]) -> None:
    from rich.table import Table

    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    c = p3["config"]
    t4 = Table(title=f"torch.compile per block  GPT h={c['hidden']} L={c['layers']} s={c['seq_len']} b={c['batch']} "
                     "fp32 (compile = cold first compiled step minus an eager step)")
    for col in ("recompute", "eager ms", "compiled ms", "speed-up", "paired", "compile s", "break-even steps"):
        t4.add_column(col, justify="right" if col != "recompute" else "left")
    for key in ("recompute_none", "recompute_full"):
        r = p3[key]
        t4.add_row(r["recompute"], ms(r["eager"]["median_step_s"]), ms(r["compiled"]["median_step_s"]),
                   f"{r['speedup_median_step']:.2f}x", f"{r['speedup_paired_median']:.2f}x", f"{r['compile_s']:.1f}",
                   "never" if r["break_even_steps"] is None else f"{r['break_even_steps']:.0f}")
    console.print(t4)


def main_compile_only(args: argparse.Namespace, console, threads: int) -> dict:
    """``--only-compile``: part 3 alone, in its own results file."""
    loads = [load_average()]
    start = time.perf_counter()
    p3 = part_compile(args)
    loads.append(load_average())
    high, note = load_note(loads, os.cpu_count() or 1)
    result = {"benchmark": "trainer_compile", "timestamp": timestamp(), "torch_version": torch.__version__,
              "threads": threads, "machine": machine_info(), "loadavg_start_end": loads, "load_high": high,
              "load_note": note, "quick": args.quick, "wall_s": time.perf_counter() - start, "compile": p3}
    print_compile_table(console, p3)
    if note:
        console.print(f"[yellow]note: {note}[/yellow]")
    if args.out is not None:
        console.print(f"wrote {write_json_atomic(args.out, result)}")
    return result


# --- report --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    from rich.console import Console
    from rich.table import Table

    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:  # a log file or pipe: wide enough that no column is cut
        console = Console(width=120)
    threads = set_threads(args.threads)
    if args.only_compile:
        return main_compile_only(args, console, threads)
    loads = [load_average()]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sampan-bench-trainer-") as tmp:
        p1 = part_trainer(args, Path(tmp))
    loads.append(load_average())
    t_mid = time.perf_counter()
    p2 = part_recompute(args)
    loads.append(load_average())
    t_rc = time.perf_counter()
    p3 = part_compile(args)
    loads.append(load_average())
    part_wall = {"trainer_vs_hand": t_mid - t_start, "recompute": t_rc - t_mid, "compile": time.perf_counter() - t_rc}
    high, note = load_note(loads, os.cpu_count() or 1)

    goals = {
        "trainer_over_hand_median_step": {"value": p1["ratio_median_step"], "goal": "<= 1.03",
                                          "met": p1["ratio_goal_met"]},
        "data_wait_pct_steady": {"value": {k: v["steady_median_pct"] for k, v in p1["data_wait"].items()
                                           if k.startswith("workers_")},
                                 "goal": "<= 2.0", "met": p1["data_wait"]["goal_met"]},
    }
    for name, r in p2.items():
        if name == "ernie_dropout0":
            continue  # a diagnostic beside "ernie": what the dropout recompute costs
        full = r["modes"]["full"]
        goals[f"{name}_full_recompute"] = {"value": {"saving_pct": full["saving_pct"],
                                                     "overhead_pct": full["overhead_pct"]},
                                           "goal": "saving >= 60% and overhead <= 40%", "met": r["full_goal_met"]}
    result = {
        "benchmark": "trainer",
        "timestamp": timestamp(),
        "torch_version": torch.__version__,
        "threads": threads,
        "machine": machine_info(),
        "loadavg_start_parts_end": loads,
        "load_high": high,
        "load_note": note,
        "quick": args.quick,
        "wall_s": time.perf_counter() - t_start,
        "wall_s_per_part": part_wall,
        "trainer_vs_hand": p1,
        "recompute": p2,
        "compile": p3,
        "goals": goals,
        "all_goals_met": all(g["met"] for g in goals.values()),
    }

    ms = lambda s: f"{s * 1e3:.1f}"  # noqa: E731
    cfg = p1["config"]
    t1 = Table(title=f"Trainer vs hand loop  GPT h={cfg['hidden']} L={cfg['layers']} V={cfg['vocab']} "
                     f"s={cfg['seq_len']} b={cfg['batch']}  fp32, {threads} threads, "
                     f"{p1['timing']['steps_timed_per_side']} steps/side interleaved")
    for col in ("", "median ms", "mean ms", "min ms"):
        t1.add_column(col, justify="right" if col else "left")
    for name in ("trainer", "hand"):
        s = p1[name]
        t1.add_row(name, ms(s["median_step_s"]), ms(s["mean_step_s"]), ms(s["min_step_s"]))
    console.print(t1)
    verdict = "ok" if p1["ratio_goal_met"] else "ABOVE GOAL"
    console.print(f"Trainer/hand median step = {p1['ratio_median_step']:.3f} (goal <= 1.03: {verdict}); "
                  f"means {p1['ratio_mean_step']:.3f}; median of paired ratios {p1['ratio_paired_median']:.3f}; "
                  f"equal work: loss diff {p1['equal_work']['loss_max_abs_diff']:.2g}, "
                  f"weights diff {p1['equal_work']['param_max_abs_diff']:.2g} after {CHECK_STEPS} steps")
    t2 = Table(title=f"Trainer data-loader wait (metrics.jsonl data_wait_pct, per {args.logging_steps}-step window)")
    for col in ("num_workers", "steady median %", "first window %", "median step ms", "windows %"):
        t2.add_column(col, justify="right")
    for key, w in p1["data_wait"].items():
        if key.startswith("workers_"):
            t2.add_row(key.split("_")[1], f"{w['steady_median_pct']:.2f}", f"{w['first_window_pct']:.2f}",
                       ms(w["median_step_s"]), " ".join(f"{x:.2f}" for x in w["per_window_pct"]))
    console.print(t2)
    t3 = Table(title=f"Activation recompute  seq={args.rc_seq_len} b={args.rc_batch} h={args.rc_hidden} "
                     f"L={args.rc_layers}  (activation = bytes alive after forward, freed in backward)")
    for col in ("model", "mode", "act. MiB", "saving", "alloc Δ", "hooks", "step ms", "overhead", "paired"):
        t3.add_column(col, justify="right" if col not in ("model", "mode") else "left")
    for name, r in p2.items():
        for mode, m in r["modes"].items():
            t3.add_row(name, mode, f"{m['activation_mib']:.1f}", f"{m['saving_pct']:.1f}%",
                       f"{m['allocator_total_delta_mib']:.1f}", f"{m['outer_saved_tensors_hooks_mib']:.1f}",
                       ms(m["median_step_s"]), f"{m['overhead_pct']:+.1f}%",
                       f"{m['overhead_pct_paired_median']:+.1f}%")
    console.print(t3)
    console.print("act. = allocated in forward, freed in backward (profiler); alloc Δ = allocator total after "
                  "forward minus before (cross-check); hooks = what an outer saved_tensors_hooks sees (blind to "
                  "selective's cache); overhead = median step vs none, paired = median of per-repeat ratios; ernie_dropout0 = "
                  "ernie without dropout (diagnostic)", highlight=False)
    print_compile_table(console, p3)
    for name, g in goals.items():
        console.print(f"{'[green]met[/green]' if g['met'] else '[red]NOT met[/red]'}  {name}: {g['value']} "
                      f"(goal {g['goal']})", highlight=False)
    if args.quick:
        console.print("[yellow]--quick: toy shapes, a few steps; the goals are not meaningful here[/yellow]")
    if note:
        console.print(f"[yellow]note: {note}[/yellow]")
    console.print(f"load average (1/5/15 min) at start, after part 1, at end: {loads}; wall {result['wall_s']:.0f} s")
    if args.out is not None:
        path = write_json_atomic(args.out, result)
        console.print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()

"""One training step of a Mixture-of-Experts model against a dense model with the same active
parameters, and where the MoE step's time goes.

The MoE side is a Qwen3-MoE (``qwen_moe`` family, every layer MoE: ``num_experts`` routed SwiGLU
experts of width ``expert_ffn``, top-``top_k``, the global-batch balancing loss on); the dense side
is a Qwen3 (``llama`` family, variant qwen3) with the same attention, embeddings and head and a
SwiGLU of width ``top_k x expert_ffn``. So one token multiplies by the same weights on both sides,
except the MoE router's ``E x h`` (checked: active parameters of the MoE = the dense model's + the
routers'), and the MoE step pays for routing, moving token copies to their experts and back, and
an optimizer step over ``E / top_k`` times the MLP parameters.

A step is forward with labels -> loss, backward, ``torch.optim.AdamW`` (foreach) step, clear the
gradients; both sides are timed in interleaved blocks (``_common.time_interleaved``). The
breakdown of the MoE step comes from a separate pass with timers on module boundaries (forward
pre / post hooks, and full backward pre / post hooks for backward): router (``mlp.gate``), expert
GEMMs (``mlp.experts``: the padded bmm on the CPU, ``torch._grouped_mm`` elsewhere; forward and backward),
permutation and combine (the rest of the MoE block: counting, sorting token copies by expert,
gathering them, weighting and ``index_add`` back, and their backward), attention (``self_attn``),
the optimizer step, and the rest (embeddings, norms, head and loss, autograd). The same pass on
the dense model splits its step into attention, MLP, optimizer and rest. Hooks add a little time
of their own, so the breakdown's shares, not its sums, are what to read.

    python benchmarks/moe_step.py                          # writes benchmarks/results/moe_step.json
    python benchmarks/moe_step.py --quick --out /tmp/q.json   # smoke run, seconds
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

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
from sampan.models import create, get_config
from sampan.nn.moe import moe_blocks, reset_moe_stats

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "moe_step.json"
DEFAULTS = dict(hidden=256, layers=4, heads=4, kv_heads=2, head_dim=64, vocab=4096, seq_len=256, batch=4,
                experts=16, top_k=2, expert_ffn=256, steps=1, repeats=10, warmup=2, profile_steps=5)
QUICK = dict(hidden=32, layers=2, heads=2, kv_heads=1, head_dim=16, vocab=128, seq_len=16, batch=2,
             experts=4, top_k=2, expert_ffn=16, steps=1, repeats=2, warmup=1, profile_steps=1)
LR, WEIGHT_DECAY = 1e-4, 0.01
AUX_COEF = 1e-3
SEED = 1234
# Module-name suffix -> breakdown part (the first that matches; the MoE block's own part is what
# is left of it after its children).
MOE_PARTS = ("router", "expert_gemms", "permute_combine", "attention", "optimizer", "rest")
DENSE_PARTS = ("attention", "mlp", "optimizer", "rest")


def build_pair(args) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The MoE model and the dense one with the same active parameters (same seed, fp32)."""
    shared = dict(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                  num_kv_heads=args.kv_heads, head_dim=args.head_dim, max_position_embeddings=args.seq_len,
                  tie_word_embeddings=False)
    moe_config = get_config("qwen3-moe-tiny", **shared, moe_intermediate_size=args.expert_ffn,
                            intermediate_size=args.top_k * args.expert_ffn, num_experts=args.experts,
                            num_experts_per_tok=args.top_k, decoder_sparse_step=1, mlp_only_layers=[],
                            router_aux_loss_coef=AUX_COEF)
    dense_config = get_config("qwen3-tiny", **shared, intermediate_size=args.top_k * args.expert_ffn)
    torch.manual_seed(SEED)
    moe = create(moe_config)
    torch.manual_seed(SEED)
    dense = create(dense_config)
    dense_params = sum(p.numel() for p in dense.parameters())
    routers = args.layers * args.experts * args.hidden
    active = moe_config.num_active_parameters()
    if active != dense_params + routers:
        raise SystemExit(f"unequal work: the MoE model's active parameters ({active:,}) are not the dense model's "
                         f"({dense_params:,}) + the routers' ({routers:,})")
    return moe, dense


def step_fn(model: torch.nn.Module, ids: torch.Tensor):
    """One training step of ``model`` on ``ids`` (forward, backward, AdamW, clear); returns it and
    the optimizer (for the breakdown's timer)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, foreach=True)
    model.train()

    def step() -> float:
        loss = model(ids, labels=ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reset_moe_stats(model)  # what the Trainer does once per step (no bias on this model)
        return float(loss.detach())

    return step, optimizer


class Timers:
    """Seconds spent inside modules (forward and backward), summed by part over timed steps."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._open: dict[tuple[int, str], float] = {}
        self.handles: list = []

    def watch(self, module: torch.nn.Module, part: str) -> None:
        key_f, key_b = (id(module), "f"), (id(module), "b")

        def fwd_pre(mod, inputs):
            self._open[key_f] = time.perf_counter()

        def fwd_post(mod, inputs, output):
            self.seconds[part] += time.perf_counter() - self._open.pop(key_f)

        def bwd_pre(mod, grad_output):
            self._open[key_b] = time.perf_counter()

        def bwd_post(mod, grad_input, grad_output):
            start = self._open.pop(key_b, None)
            if start is not None:
                self.seconds[part] += time.perf_counter() - start

        self.handles += [module.register_forward_pre_hook(fwd_pre), module.register_forward_hook(fwd_post),
                         module.register_full_backward_pre_hook(bwd_pre),
                         module.register_full_backward_hook(bwd_post)]

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def breakdown(model: torch.nn.Module, optimizer, step, steps: int, moe: bool) -> dict[str, float]:
    """Mean seconds per step in each part (see the module docstring), over ``steps`` hooked steps."""
    timers = Timers()
    layers = model.model.layers
    for layer in layers:
        timers.watch(layer.self_attn, "attention")
        if moe:
            timers.watch(layer.mlp, "_moe_block")
            timers.watch(layer.mlp.gate, "router")
            timers.watch(layer.mlp.experts, "expert_gemms")
        else:
            timers.watch(layer.mlp, "mlp")
    optimizer_step = optimizer.step

    def timed_step(*a, **k):
        start = time.perf_counter()
        try:
            return optimizer_step(*a, **k)
        finally:
            timers.seconds["optimizer"] += time.perf_counter() - start

    optimizer.step = timed_step
    try:
        step()  # a warm step with the hooks in place
        timers.seconds.clear()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        total = time.perf_counter() - start
    finally:
        optimizer.step = optimizer_step
        timers.remove()
    parts = {k: v / steps for k, v in timers.seconds.items()}
    if moe:
        parts["permute_combine"] = parts.pop("_moe_block") - parts["router"] - parts["expert_gemms"]
    parts["rest"] = total / steps - sum(parts.values())
    order = MOE_PARTS if moe else DENSE_PARTS
    return {"step_s": total / steps, "parts_s": {k: parts[k] for k in order},
            "shares": {k: parts[k] / (total / steps) for k in order}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for key in DEFAULTS:
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, a smoke run")
    parser.add_argument("--out", type=Path, default=None)
    args = apply_presets(parser.parse_args(argv), QUICK if parser.parse_args(argv).quick else DEFAULTS, DEFAULT_OUT)
    from rich.console import Console

    console = Console()
    threads = set_threads(args.threads)
    load_at_start = load_average()
    wall_start = time.perf_counter()

    moe, dense = build_pair(args)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len), generator=torch.Generator().manual_seed(SEED))
    moe_step, moe_opt = step_fn(moe, ids)
    dense_step, dense_opt = step_fn(dense, ids)
    losses = {"moe": moe_step(), "dense": dense_step()}
    if not all(math.isfinite(v) for v in losses.values()):
        raise SystemExit(f"a non-finite first loss: {losses}")
    # The expert GEMM path this run takes: GroupedExperts' "auto" rule (torch._grouped_mm off the
    # CPU where it runs; on the CPU the padded bmm, which was faster there).
    experts = moe_blocks(moe)[0][1].experts
    probe = torch.zeros(1, args.hidden)
    grouped = experts.backend == "grouped_mm" or (
        experts.backend == "auto" and probe.device.type != "cpu" and experts.grouped_mm_fits(probe))

    timings = time_interleaved({"moe": moe_step, "dense": dense_step}, args.steps, args.repeats, args.warmup)
    ratio = timings["moe"].median / timings["dense"].median
    paired = statistics.median(m / d for m, d in zip(timings["moe"].per_step, timings["dense"].per_step, strict=True))
    moe_parts = breakdown(moe, moe_opt, moe_step, args.profile_steps, moe=True)
    dense_parts = breakdown(dense, dense_opt, dense_step, args.profile_steps, moe=False)

    moe_total = sum(p.numel() for p in moe.parameters())
    dense_total = sum(p.numel() for p in dense.parameters())
    tokens = args.batch * args.seq_len
    result = {
        "benchmark": "moe_step",
        "timestamp": timestamp(),
        "torch_version": torch.__version__,
        "threads": threads,
        "machine": machine_info(),
        "loadavg_at_start": load_at_start,
        "quick": args.quick,
        "shapes": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads, "kv_heads": args.kv_heads,
                   "head_dim": args.head_dim, "vocab": args.vocab, "seq_len": args.seq_len, "batch": args.batch,
                   "experts": args.experts, "top_k": args.top_k, "expert_ffn": args.expert_ffn,
                   "dense_ffn": args.top_k * args.expert_ffn, "dtype": "float32",
                   "aux_loss": "global_batch", "aux_loss_coef": AUX_COEF},
        "expert_gemm_path": "grouped_mm" if grouped else "padded_bmm",
        "params": {"moe_total": moe_total, "moe_active": moe.config.num_active_parameters(),
                   "dense": dense_total, "routers": args.layers * args.experts * args.hidden},
        "flops_per_token": {"moe": moe.config.flops_per_token(args.seq_len),
                            "dense": dense.config.flops_per_token(args.seq_len)},
        "tokens_per_step": tokens,
        "first_losses": losses,
        "timing": {"steps_per_block": args.steps, "repeats": args.repeats, "warmup": args.warmup,
                   "interleaved": True},
        "moe": {**timings["moe"].as_dict(), "tokens_per_s": tokens / timings["moe"].median},
        "dense": {**timings["dense"].as_dict(), "tokens_per_s": tokens / timings["dense"].median},
        "ratio_moe_over_dense": ratio,
        "ratio_paired_median": paired,
        "breakdown": {"profile_steps": args.profile_steps, "moe": moe_parts, "dense": dense_parts},
        "wall_s": None,
    }
    result["wall_s"] = time.perf_counter() - wall_start

    from rich.table import Table

    table = Table(title=f"train step  h={args.hidden} L={args.layers} s={args.seq_len} b={args.batch} V={args.vocab}  "
                        f"MoE {args.experts} experts top-{args.top_k} x {args.expert_ffn} vs dense {args.top_k * args.expert_ffn}"
                        f"  fp32, {threads} threads")
    for col in ("", "median ms", "min ms", "tokens/s", "params"):
        table.add_column(col, justify="right" if col else "left")
    table.add_row("moe", f"{timings['moe'].median * 1e3:.1f}", f"{timings['moe'].min * 1e3:.1f}",
                  f"{result['moe']['tokens_per_s']:.0f}", f"{moe_total:,} ({result['params']['moe_active']:,} active)")
    table.add_row("dense", f"{timings['dense'].median * 1e3:.1f}", f"{timings['dense'].min * 1e3:.1f}",
                  f"{result['dense']['tokens_per_s']:.0f}", f"{dense_total:,}")
    console.print(table)
    console.print(f"ratio moe/dense (median step) = {ratio:.2f}; median of paired-block ratios = {paired:.2f}; "
                  f"expert GEMMs on {result['expert_gemm_path']}")
    for name, parts in (("moe", moe_parts), ("dense", dense_parts)):
        shares = "  ".join(f"{k} {v * 1e3:.1f} ms ({parts['shares'][k]:.0%})" for k, v in parts["parts_s"].items())
        console.print(f"{name} step {parts['step_s'] * 1e3:.1f} ms with timers: {shares}")
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

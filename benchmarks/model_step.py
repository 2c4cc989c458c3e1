"""One GPT training step: sampan vs the same model written in plain PyTorch.

A step is forward with labels -> loss, backward, AdamW step, clear the gradients. The baseline is
an independent pre-norm GPT (below) with torch.optim.AdamW and the same hyper-parameters. Before
timing, sampan's weights are copied into the baseline by an explicit name map and both must give
the same loss on the same batch (before and after one optimizer step), so the two sides do the
same work. Steps are timed in interleaved blocks; the script also measures the rate an fp32 GEMM
reaches on this machine and reports achieved GFLOP/s (``GPTConfig.flops_per_token``) as a share of
it. That share is stored under ``mfu`` for the results files already written, but it is not MFU,
which divides by the processor's peak (``sampan.utils.hardware.cpu_peak``).

    python benchmarks/model_step.py                       # defaults, writes benchmarks/results/model_step.json
    python benchmarks/model_step.py --quick --out /tmp/q.json   # smoke run, seconds
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import sampan.optimizer

# Benchmarks run as scripts (python benchmarks/NAME.py): their folder is on sys.path.
from _common import (
    apply_presets,
    gemm_peak_gflops,
    load_average,
    machine_info,
    set_threads,
    time_interleaved,
    timestamp,
    write_json_atomic,
)
from sampan.models import registry

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "model_step.json"
DEFAULTS = dict(hidden=256, layers=4, heads=4, vocab=8192, seq_len=256, batch=8, steps=1, repeats=10,
                warmup=2, gemm_n=2048)
QUICK = dict(hidden=32, layers=2, heads=2, vocab=128, seq_len=16, batch=2, steps=2, repeats=2,
             warmup=1, gemm_n=256)
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.999), 1e-8, 0.01
SEED = 1234
LOSS_TOL = 1e-5


# --- the baseline: a pre-norm GPT in plain PyTorch ---------------------------------------------
class Block(nn.Module):
    def __init__(self, h: int, n_head: int, eps: float):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(h, eps=eps)
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
        self.ln_2 = nn.LayerNorm(h, eps=eps)
        self.fc_in = nn.Linear(h, 4 * h)
        self.fc_out = nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        y = self.ln_1(x)
        q, k, v = (proj(y).view(b, s, self.n_head, h // self.n_head).transpose(1, 2)
                   for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, s, h))
        return x + self.fc_out(F.gelu(self.fc_in(self.ln_2(x)), approximate="tanh"))


class BaselineGPT(nn.Module):
    def __init__(self, vocab: int, h: int, n_layer: int, n_head: int, max_pos: int, eps: float = 1e-5):
        super().__init__()
        self.wte = nn.Embedding(vocab, h)
        self.wpe = nn.Embedding(max_pos, h)
        self.blocks = nn.ModuleList(Block(h, n_head, eps) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(h, eps=eps)
        self.head = nn.Linear(h, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied LM head

    def forward(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x)[:, :-1])  # position t predicts token t + 1
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def baseline_name(sampan_name: str) -> str:
    """sampan parameter name -> baseline parameter name (KeyError for anything unexpected)."""
    fixed = {
        "gpt.embeddings.word_embeddings.weight": "wte.weight",
        "lm_head.weight": "head.weight",
        "gpt.embeddings.position_embeddings.weight": "wpe.weight",
        "gpt.norm.weight": "ln_f.weight",
        "gpt.norm.bias": "ln_f.bias",
    }
    if sampan_name in fixed:
        return fixed[sampan_name]
    parts = sampan_name.split(".")  # gpt.layers.<i>.<module path>.<weight|bias>
    if len(parts) < 5 or parts[:2] != ["gpt", "layers"]:
        raise KeyError(sampan_name)
    index, module_path, leaf = parts[2], ".".join(parts[3:-1]), parts[-1]
    sub = {"attn.q_proj": "q", "attn.k_proj": "k", "attn.v_proj": "v", "attn.out_proj": "o",
           "norm1": "ln_1", "norm2": "ln_2", "mlp.fc1": "fc_in", "mlp.fc2": "fc_out"}
    return f"blocks.{index}.{sub[module_path]}.{leaf}"


def copy_sampan_into_baseline(sampan_model: nn.Module, baseline: nn.Module) -> None:
    ours = dict(baseline.named_parameters())
    mapped = {baseline_name(name): p for name, p in sampan_model.named_parameters()}
    if set(mapped) != set(ours):
        raise RuntimeError(f"name map mismatch: only sampan {sorted(set(mapped) - set(ours))}, "
                           f"only baseline {sorted(set(ours) - set(mapped))}")
    with torch.no_grad():
        for name, p in ours.items():
            if p.shape != mapped[name].shape:
                raise RuntimeError(f"{name}: shape {tuple(p.shape)} vs sampan {tuple(mapped[name].shape)}")
            p.copy_(mapped[name])


# --- the benchmark -----------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, help=f"hidden size (default {DEFAULTS['hidden']})")
    parser.add_argument("--layers", type=int, help=f"transformer blocks (default {DEFAULTS['layers']})")
    parser.add_argument("--heads", type=int, help=f"attention heads (default {DEFAULTS['heads']})")
    parser.add_argument("--vocab", type=int, help=f"vocabulary size (default {DEFAULTS['vocab']})")
    parser.add_argument("--seq-len", type=int, help=f"sequence length (default {DEFAULTS['seq_len']})")
    parser.add_argument("--batch", type=int, help=f"batch size (default {DEFAULTS['batch']})")
    parser.add_argument("--steps", type=int, help=f"steps per timed block (default {DEFAULTS['steps']})")
    parser.add_argument("--repeats", type=int, help=f"timed blocks per side (default {DEFAULTS['repeats']})")
    parser.add_argument("--warmup", type=int, help=f"untimed steps per side first (default {DEFAULTS['warmup']})")
    parser.add_argument("--gemm-n", type=int, help=f"GEMM size for the peak (default {DEFAULTS['gemm_n']})")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes and few steps (smoke test); writes JSON only when --out is given")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON output (default benchmarks/results/model_step.json; none with --quick)")
    args = parser.parse_args(argv)
    return apply_presets(args, QUICK if args.quick else DEFAULTS, None if args.quick else DEFAULT_OUT)


def optimizer_kernel_times(model: torch.nn.Module, steps: int = 20) -> dict[str, float]:
    """Median ms of one AdamW step over ``model``'s parameters: torch's default loop vs fused."""
    params = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    out = {}
    for name, kwargs in (("default_loop", {}), ("fused", {"fused": True})):
        opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, **kwargs)
        opt.step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times) * 1e3
    return out


def main(argv: list[str] | None = None) -> dict:
    from rich.console import Console
    from rich.table import Table

    args = parse_args(argv)
    console = Console()
    threads = set_threads(args.threads)
    load_at_start = load_average()

    config = registry.get_config("gpt-tiny", hidden_size=args.hidden, num_layers=args.layers,
                                 num_heads=args.heads, vocab_size=args.vocab,
                                 max_position_embeddings=args.seq_len, intermediate_size=4 * args.hidden)
    torch.manual_seed(SEED)
    sampan_model = registry.create(config).train()
    baseline = BaselineGPT(args.vocab, args.hidden, args.layers, args.heads, args.seq_len,
                           config.layer_norm_eps).train()
    copy_sampan_into_baseline(sampan_model, baseline)

    n_sampan = sum(p.numel() for p in sampan_model.parameters())
    n_base = sum(p.numel() for p in baseline.parameters())
    if not n_sampan == n_base == config.num_parameters():
        raise RuntimeError(f"parameter counts differ: sampan {n_sampan}, baseline {n_base}, "
                           f"config {config.num_parameters()}")

    opt_s = sampan.optimizer.AdamW(learning_rate=LR, beta1=BETAS[0], beta2=BETAS[1], epsilon=EPS,
                                   parameters=sampan_model.parameters(), weight_decay=WEIGHT_DECAY)
    # The same fused AdamW kernel sampan picks by default, so the ratio measures sampan's own
    # overhead; what the kernel choice itself is worth is measured apart (optimizer_kernels).
    opt_b = torch.optim.AdamW(baseline.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                              fused=True)

    gen = torch.Generator().manual_seed(SEED)
    input_ids = torch.randint(0, args.vocab, (args.batch, args.seq_len), generator=gen)

    def sampan_step() -> torch.Tensor:
        loss = sampan_model(input_ids, labels=input_ids)
        loss.backward()
        opt_s.step()
        opt_s.clear_grad()
        return loss

    def baseline_step() -> torch.Tensor:
        loss = baseline(input_ids, input_ids)
        loss.backward()
        opt_b.step()
        opt_b.zero_grad()
        return loss

    # Equal work: same loss before and after one optimizer step (checks forward, grads and AdamW).
    loss_diffs, losses = [], []
    for _ in range(2):
        ls, lb = sampan_step().item(), baseline_step().item()
        losses.append((ls, lb))
        loss_diffs.append(abs(ls - lb))
    loss_max_diff = max(loss_diffs)
    if not loss_max_diff <= LOSS_TOL:
        raise RuntimeError(f"losses differ by {loss_max_diff:.3g} > {LOSS_TOL}: {losses}")

    gemm_peak = gemm_peak_gflops(args.gemm_n)
    t0 = time.perf_counter()
    timings = time_interleaved({"sampan": sampan_step, "baseline": baseline_step},
                               steps=args.steps, repeats=args.repeats, warmup=args.warmup)
    timed_s = time.perf_counter() - t0
    gemm_peak_after = gemm_peak_gflops(args.gemm_n)

    kernels = optimizer_kernel_times(baseline)

    tokens = args.batch * args.seq_len
    flops_per_step = config.flops_per_token(args.seq_len) * tokens
    ratio = timings["sampan"].median / timings["baseline"].median
    # Blocks run back to back in pairs, so a per-pair ratio cancels slow drifts and bursts of load.
    paired = statistics.median(
        s / b for s, b in zip(timings["sampan"].per_step, timings["baseline"].per_step, strict=True)
    )
    peak = max(gemm_peak, gemm_peak_after)
    sides = {}
    for name, t in timings.items():
        achieved = flops_per_step / t.median / 1e9
        sides[name] = {**t.as_dict(), "achieved_gflops": achieved, "mfu": achieved / peak,
                       "tokens_per_s": tokens / t.median}

    result = {
        "benchmark": "model_step",
        "timestamp": timestamp(),
        "torch_version": torch.__version__,
        "threads": threads,
        "machine": machine_info(),
        "loadavg_at_start": load_at_start,
        "quick": args.quick,
        "shapes": {"hidden": args.hidden, "layers": args.layers, "heads": args.heads, "vocab": args.vocab,
                   "seq_len": args.seq_len, "batch": args.batch, "intermediate": config.intermediate_size,
                   "dtype": "float32"},
        "timing": {"steps_per_block": args.steps, "repeats": args.repeats, "warmup": args.warmup,
                   "interleaved": True, "timed_wall_s": timed_s},
        "optimizer": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WEIGHT_DECAY},
        "params": n_sampan,
        "tokens_per_step": tokens,
        "flops_per_token": config.flops_per_token(args.seq_len),
        "flops_per_step": flops_per_step,
        "sampan": sides["sampan"],
        "baseline": sides["baseline"],
        "ratio_sampan_over_baseline": ratio,
        "ratio_paired_median": paired,
        "ratio_goal": 1.05,
        "ratio_ok": ratio <= 1.05,
        "gemm_peak_gflops": peak,
        "gemm_peak_gflops_before_after": [gemm_peak, gemm_peak_after],
        "gemm_n": args.gemm_n,
        "optimizer_kernels_ms": kernels,
        "loss_match": {"max_abs_diff": loss_max_diff, "tolerance": LOSS_TOL,
                       "losses_sampan_baseline": [list(pair) for pair in losses]},
    }

    table = Table(title=f"GPT train step  h={args.hidden} L={args.layers} heads={args.heads} V={args.vocab} "
                        f"s={args.seq_len} b={args.batch}  fp32, {threads} threads")
    for col in ("", "median ms", "min ms", "GFLOP/s", "GEMM share", "tokens/s"):
        table.add_column(col, justify="right" if col else "left")
    for name in ("sampan", "baseline"):
        s = sides[name]
        table.add_row(name, f"{s['median_step_s'] * 1e3:.1f}", f"{s['min_step_s'] * 1e3:.1f}",
                      f"{s['achieved_gflops']:.1f}", f"{s['mfu']:.1%}", f"{s['tokens_per_s']:.0f}")
    console.print(table)
    busy = [x for x in (load_at_start, result["machine"]["loadavg_1_5_15"]) if x and x[0] > 0.5]
    if busy:
        console.print(f"[yellow]note: 1-min load average was {max(x[0] for x in busy):.1f} on "
                      f"{os.cpu_count()} CPUs: other jobs were running, timings are noisy[/yellow]")
    verdict = "ok" if ratio <= 1.05 else "ABOVE GOAL"
    console.print(f"ratio sampan/baseline (median step) = {ratio:.3f}  (goal <= 1.05: {verdict}); "
                  f"median of paired-block ratios = {paired:.3f}")
    console.print(f"params {n_sampan:,}  flops/step {flops_per_step / 1e9:.2f} GFLOP  "
                  f"fp32 GEMM peak {peak:.1f} GFLOP/s (n={args.gemm_n})  loss max diff {loss_max_diff:.2g}")
    console.print(f"AdamW step alone: torch default per-tensor loop {kernels['default_loop']:.1f} ms, fused "
                  f"{kernels['fused']:.1f} ms (sampan's default)")
    if args.out is not None:
        path = write_json_atomic(args.out, result)
        console.print(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()

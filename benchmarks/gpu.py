"""One prepared benchmark for a lent GPU: run it once, unattended, and it writes one JSON file.

    python benchmarks/gpu.py                          # on the GPU: writes benchmarks/results/gpu.json
    python benchmarks/gpu.py --device cpu --quick     # the same code paths at toy shapes (in the tests)

Made to finish in under 8 minutes on one H200 with no network and nothing to download: every model
is built from a named config with random weights. Sections, in order of importance (each one
checks the time left against ``--budget-s`` first and is recorded as skipped when it would not
fit, so a slow machine still leaves a complete file):

1. ``train``: the bf16 training step (forward with labels -> loss, backward, fused AdamW step) of
   gpt-1.3b and llama3.2-1b, sampan's model against the same model written in plain PyTorch
   (``model_step.BaselineGPT``, ``plain_llama.PlainLlama``), eager and then compiled (each
   transformer block through ``torch.compile``, sampan's ``apply_compile`` for both sides).
   Equal work is checked before timing: the baseline gets sampan's weights and the two fp32
   losses on the same batch must agree. Sides are timed in interleaved blocks; MFU is
   ``flops_per_token x tokens / step time / peak``, with the datasheet dense bf16 peak (H100 /
   H200: 989 TFLOP/s, as torchtitan counts; on the CPU the processor's own figure,
   ``sampan.utils.hardware.cpu_peak``) and the same FLOP count for both sides. A second figure,
   ``gemm_share``, divides by the rate of a square bf16 matmul timed in the same interleaved
   blocks as the steps (so the same load slows both): how close the step comes to what the
   device's GEMM reaches now. The compile time (first compiled step minus an eager step) is
   reported apart.
2. ``recompute``: none / full / selective on gpt-1.3b: peak memory of a step and its time.
3. ``largest_batch``: the largest batch of gpt-1.3b at the training sequence length that trains
   without running out of memory, without and with full recompute (doubling, then bisecting).
4. ``to_static_decode``: greedy decoding with a data-dependent stop (``examples/jit_export.py``),
   eager Python against ``sampan.jit.to_static`` (one ``torch.while_loop``), equal tokens first.
5. ``predictor``: an exported ERNIE-base classifier through ``create_predictor`` on the device
   (``Config.enable_use_gpu``), against the eager model, batch 1 and 32 at sequence 128.

On the CPU (``--device cpu``) peak memory is not measured (``benchmarks/trainer.py`` measures
activation memory there); the largest-batch search stops at ``--max-batch``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from model_step import BaselineGPT, copy_sampan_into_baseline
from plain_llama import PlainLlama

# Benchmarks run as scripts (python benchmarks/NAME.py): their folder is on sys.path.
from _common import machine_info, time_interleaved, timestamp, write_json_atomic
from sampan.models import registry
from sampan.nn.compile import apply_compile
from sampan.trainer import apply_recompute
from sampan.utils.device import resolve_device
from sampan.utils.hardware import cpu_peak, device_peak_flops

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "gpu.json"
SEED = 1234
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.95), 1e-8, 0.1
LOSS_TOL = 2e-4  # fp32 losses of sampan and the baseline, relative (TF32 off for the check)
# Full shapes (a GPU) and --quick shapes (the tests, on the CPU): the same code runs both.
FULL = dict(models={"gpt-1.3b": {}, "llama3.2-1b": {}}, seq_len=2048, batch=8, repeats=8, warmup=2, gemm_n=8192,
            recompute_model="gpt-1.3b", max_batch=256, decode=dict(name="gpt-medium", prompt=16, new=64, batch=8),
            predictor=dict(name="ernie-base", seq=128, batches=(1, 32)), predictor_repeats=30, compile_backend="inductor")
QUICK = dict(models={"gpt-1.3b": dict(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                      intermediate_size=256, max_position_embeddings=64),
                     "llama3.2-1b": dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                         intermediate_size=128, vocab_size=256, max_position_embeddings=64,
                                         bos_token_id=None, eos_token_id=1)},
             seq_len=32, batch=2, repeats=2, warmup=1, gemm_n=512, recompute_model="gpt-1.3b", max_batch=4,
             decode=dict(name="gpt-tiny", prompt=3, new=4, batch=2, overrides=dict(
                 hidden_size=32, num_layers=1, num_heads=2, vocab_size=32, max_position_embeddings=16)),
             predictor=dict(name="ernie-tiny", seq=16, batches=(1, 4), overrides=dict(num_layers=1)),
             # aot_eager: dynamo and AOT autograd on sampan's blocks (what sampan's code can break)
             # without inductor's C++ build for the CPU, a minute of the suite that a GPU never runs.
             predictor_repeats=3, compile_backend="aot_eager")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (with --quick, for the tests)")
    parser.add_argument("--quick", action="store_true", help="toy shapes, a few steps: checks the code paths")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="stop starting sections after this many seconds (default 450: 7.5 min)")
    parser.add_argument("--sections", default="train,recompute,largest_batch,to_static_decode,predictor",
                        help="comma-separated sections to run (default: all)")
    parser.add_argument("--no-compile", action="store_true", help="time eager only in the train section")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON to write (default benchmarks/results/gpu.json; --quick: none unless given)")
    args = parser.parse_args(argv)
    args.shape = QUICK if args.quick else FULL
    if args.out is None and not args.quick:
        args.out = DEFAULT_OUT
    return args


# --- timing on a device --------------------------------------------------------------------------
def synced(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """``fn`` followed by a device synchronisation, so wall-clock timing sees the GPU's work."""
    if device.type != "cuda":
        return fn

    def run():
        out = fn()
        torch.cuda.synchronize(device)
        return out

    return run


def reset_peak(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def peak_above(device: torch.device, start: int | None) -> int | None:
    if device.type != "cuda" or start is None:
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --- models and steps ----------------------------------------------------------------------------
def build(name: str, overrides: dict[str, Any], device: torch.device) -> torch.nn.Module:
    torch.manual_seed(SEED)
    return registry.create(registry.get_config(name, **overrides)).to(device).train()


def plain_twin(model: torch.nn.Module) -> torch.nn.Module:
    """The same model in plain PyTorch, holding ``model``'s weights (on its device)."""
    config = model.config
    device = next(model.parameters()).device
    if type(config).__name__ == "GPTConfig":
        twin = BaselineGPT(config.vocab_size, config.hidden_size, config.num_layers, config.num_heads,
                           config.max_position_embeddings, eps=config.layer_norm_eps).to(device)
        copy_sampan_into_baseline(model, twin)
    else:
        twin = PlainLlama(config).to(device)
        twin.load_state_dict(model.state_dict(), strict=True)
    return twin.train()


def loss_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    if isinstance(model, BaselineGPT):
        return model(ids, ids)
    if isinstance(model, PlainLlama):
        return model(ids, labels=ids)
    return model(input_ids=ids, labels=ids)


def check_equal_work(model, twin, ids) -> float:
    """Relative difference of the fp32 losses of ``model`` and ``twin`` on ``ids`` (TF32 off)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            a, b = float(loss_of(model, ids)), float(loss_of(twin, ids))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    diff = abs(a - b) / max(abs(b), 1e-12)
    if diff > LOSS_TOL:
        raise RuntimeError(f"{type(model).__name__}: sampan loss {a:.6f} vs plain PyTorch {b:.6f} "
                           f"(relative {diff:.2g} > {LOSS_TOL}): the two do not compute the same model")
    return diff


def train_step(model: torch.nn.Module, ids: torch.Tensor, device: torch.device) -> Callable[[], float]:
    """One bf16-autocast training step of ``model`` on ``ids`` (fresh fused AdamW)."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=True)

    def step() -> float:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_of(model, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def gemm(n: int, device: torch.device) -> Callable[[], torch.Tensor]:
    """One ``n x n`` bf16 matmul (``2 n^3`` FLOPs) on ``device``: the rate ``gemm_share`` divides by."""
    gen = torch.Generator().manual_seed(SEED)
    a, b = (torch.randn(n, n, generator=gen).to(device, torch.bfloat16) for _ in range(2))
    return lambda: torch.mm(a, b)


def tokens(vocab: int, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab, (batch, seq), generator=gen).to(device)


# --- sections ------------------------------------------------------------------------------------
def section_train(args, device, peak) -> dict[str, Any]:
    shape = args.shape
    seq, batch = shape["seq_len"], shape["batch"]
    out: dict[str, Any] = {"seq_len": seq, "batch": batch, "peak_flops": peak, "dtype": "bf16 autocast"}
    for name, overrides in shape["models"].items():
        try:
            out[name] = train_one(args, device, peak, name, overrides)
        except Exception as err:  # the other model's figures still count
            if device.type == "cuda" and is_oom(err):
                free(device)
            out[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
            out.setdefault("errors", []).append(name)
        free(device)
    return out


def train_one(args, device, peak, name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    shape = args.shape
    seq, batch = shape["seq_len"], shape["batch"]
    model = build(name, overrides, device)
    twin = plain_twin(model)
    config = model.config
    check_ids = tokens(config.vocab_size, 1, min(seq, 128), device)
    row: dict[str, Any] = {"params": sum(p.numel() for p in model.parameters()),
                           "flops_per_token": config.flops_per_token(seq),
                           "equal_work_loss_rel_diff": check_equal_work(model, twin, check_ids)}
    ids = tokens(config.vocab_size, batch, seq, device)
    flops = config.flops_per_token(seq) * batch * seq
    for mode in ("eager", "compiled"):
        if mode == "compiled" and args.no_compile:
            continue
        if mode == "compiled":
            import torch._dynamo

            torch._dynamo.reset()
            apply_compile(model, backend=shape["compile_backend"])
            apply_compile(twin, backend=shape["compile_backend"])
        steps = {"sampan": synced(train_step(model, ids, device), device),
                 "plain": synced(train_step(twin, ids, device), device)}
        first = {}
        for side, fn in steps.items():
            start = time.perf_counter()
            fn()
            first[side] = time.perf_counter() - start
        # The GEMM runs in the same interleaved blocks as the steps: whatever else holds the
        # device then slows it as it slows them, so their ratio does not move with the load.
        n = shape["gemm_n"]
        timings = time_interleaved({**steps, "gemm": synced(gemm(n, device), device)}, steps=1,
                                   repeats=shape["repeats"], warmup=shape["warmup"])
        gemm_flops = 2 * n**3 / timings.pop("gemm").median
        sides = {}
        for side, timing in timings.items():
            sides[side] = {**timing.as_dict(), "first_step_s": first[side],
                           "tokens_per_s": batch * seq / timing.median,
                           "mfu": flops / timing.median / peak if peak else None,
                           "gemm_share": flops / timing.median / gemm_flops}
        result = {"sides": sides, "gemm_bf16_flops": gemm_flops, "gemm_n": n,
                  "backend": shape["compile_backend"] if mode == "compiled" else "eager",
                  "sampan_over_plain_step": timings["sampan"].median / timings["plain"].median,
                  "paired_median": statistics.median(
                      a / b for a, b in zip(timings["sampan"].per_step, timings["plain"].per_step, strict=True))}
        if mode == "compiled":
            eager = row["eager"]["sides"]
            result["compile_s"] = {side: first[side] - eager[side]["median_step_s"] for side in steps}
            result["speedup_over_eager"] = {side: eager[side]["median_step_s"] / sides[side]["median_step_s"]
                                            for side in steps}
        row[mode] = result
    del model, twin, steps
    return row


def section_recompute(args, device, peak) -> dict[str, Any]:
    shape = args.shape
    name = shape["recompute_model"]
    base = build(name, shape["models"][name], device)
    ids = tokens(base.config.vocab_size, shape["batch"], shape["seq_len"], device)
    modes: dict[str, Any] = {}
    fns = {}
    for mode in ("none", "full", "selective"):
        model = base if mode == "none" else copy.deepcopy(base)
        apply_recompute(model, mode)
        fns[mode] = synced(train_step(model, ids, device), device)
        fns[mode]()  # optimizer state and first-call allocations are not activations
        start = reset_peak(device)
        fns[mode]()
        modes[mode] = {"peak_step_bytes": peak_above(device, start)}
        if mode != "none":
            del model
            fns[mode] = None
            free(device)
    # Timing keeps one model at a time on the device (three 1.3B copies with AdamW do not fit with
    # room for activations everywhere), so modes are timed one after another, not interleaved.
    for mode in ("none", "full", "selective"):
        model = base if mode == "none" else copy.deepcopy(base)
        apply_recompute(model, mode)
        timing = time_interleaved({mode: synced(train_step(model, ids, device), device)}, steps=1,
                                  repeats=shape["repeats"], warmup=shape["warmup"])[mode]
        modes[mode].update(timing.as_dict())
        if mode != "none":
            del model
            free(device)
    none = modes["none"]
    for m in modes.values():
        m["time_added_pct"] = 100.0 * (m["median_step_s"] / none["median_step_s"] - 1)
        if none["peak_step_bytes"]:
            m["memory_saved_pct"] = 100.0 * (1 - m["peak_step_bytes"] / none["peak_step_bytes"])
    return {"model": name, "seq_len": shape["seq_len"], "batch": shape["batch"], "modes": modes}


def fits(model, vocab: int, batch: int, seq: int, device: torch.device) -> bool:
    try:
        step = synced(train_step(model, tokens(vocab, batch, seq, device), device), device)
        step()
        step()  # the second step holds the optimizer state as well
        return True
    except RuntimeError as err:
        if not is_oom(err):
            raise
        return False
    finally:
        model.zero_grad(set_to_none=True)
        free(device)


def section_largest_batch(args, device, peak) -> dict[str, Any]:
    shape = args.shape
    name = shape["recompute_model"]
    model = build(name, shape["models"][name], device)
    seq, cap = shape["seq_len"], shape["max_batch"]
    out: dict[str, Any] = {"model": name, "seq_len": seq, "search_cap": cap}
    for mode in ("none", "full"):
        apply_recompute(model, mode)
        good, bad, probes = 0, None, []
        batch = 1
        while batch <= cap:
            ok = fits(model, model.config.vocab_size, batch, seq, device)
            probes.append((batch, ok))
            if not ok:
                bad = batch
                break
            good, batch = batch, batch * 2
        while bad is not None and bad - good > max(1, good // 8):  # bisect to within 1/8
            mid = (good + bad) // 2
            ok = fits(model, model.config.vocab_size, mid, seq, device)
            probes.append((mid, ok))
            good, bad = (mid, bad) if ok else (good, mid)
        out[f"recompute_{mode}"] = {"largest_batch": good, "first_failing": bad, "hit_cap": bad is None,
                                    "probes": probes}
    del model
    free(device)
    return out


def section_to_static_decode(args, device, peak) -> dict[str, Any]:
    from to_static import load_example

    import sampan

    spec = args.shape["decode"]
    example = load_example()
    model = build(spec["name"], {**spec.get("overrides", {}),
                                 "max_position_embeddings": spec["prompt"] + spec["new"]}, device).eval()
    prompt = tokens(model.config.vocab_size, spec["batch"], spec["prompt"], device).clamp_(min=1)
    generate = example.make_generate(model, spec["new"], eos=-1, pad=0)  # no early stop: full length
    backend = "eager" if args.quick else "inductor"
    static = sampan.jit.to_static(generate, backend=backend)
    with torch.no_grad():
        start = time.perf_counter()
        want = generate(prompt)
        eager_first = time.perf_counter() - start
        start = time.perf_counter()
        got = static(prompt)
        static_first = time.perf_counter() - start
        if not torch.equal(got[0], want[0]) or int(got[1]) != int(want[1]):
            raise RuntimeError("to_static decoding differs from eager: unequal work")
        timings = time_interleaved({"eager": synced(lambda: generate(prompt), device),
                                    "to_static": synced(lambda: static(prompt), device)},
                                   steps=1, repeats=args.shape["repeats"], warmup=1)
    eager, static_t = timings["eager"].median, timings["to_static"].median
    new_tokens = spec["batch"] * spec["new"]
    return {"model": spec["name"], "backend": backend, "batch": spec["batch"], "prompt": spec["prompt"],
            "new_tokens": spec["new"], "eager": timings["eager"].as_dict(),
            "to_static": timings["to_static"].as_dict(), "speedup": eager / static_t,
            "tokens_per_s": {"eager": new_tokens / eager, "to_static": new_tokens / static_t},
            "first_call_s": {"eager": eager_first, "to_static": static_first},
            "graph_breaks": static.stats()["graph_breaks"]}


def section_predictor(args, device, peak) -> dict[str, Any]:
    import numpy as np

    from sampan.inference import Config, create_predictor, export_model_dir

    spec = args.shape["predictor"]
    torch.manual_seed(SEED)
    model = registry.create(spec["name"], head="sequence_classification", num_labels=2,
                            **spec.get("overrides", {})).eval()
    out: dict[str, Any] = {"model": spec["name"], "seq_len": spec["seq"], "rows": {}}
    with tempfile.TemporaryDirectory(prefix="sampan-gpu-predictor-") as tmp:
        saved = model.save_pretrained(Path(tmp) / "model")
        exported = export_model_dir(saved, Path(tmp) / "inference")
        config = Config(exported, backend="torch")
        if device.type == "cuda":
            config.enable_use_gpu(100, device.index or 0)
        predictor = create_predictor(config)
        model = model.to(device)
        for batch in spec["batches"]:
            ids = np.random.default_rng(batch).integers(1, model.config.vocab_size, (batch, spec["seq"]), dtype=np.int64)
            mask = np.ones_like(ids)
            t_ids, t_mask = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)

            def eager(t_ids=t_ids, t_mask=t_mask):
                with torch.inference_mode():
                    return model(t_ids, attention_mask=t_mask).float().cpu().numpy()

            def served(ids=ids, mask=mask):
                return predictor.run([ids, mask])[0]

            want, got = eager(), served()
            diff = float(np.abs(np.asarray(got, dtype=np.float32) - want).max())
            if diff > 1e-3:
                raise RuntimeError(f"predictor logits differ from eager by {diff:.3g} at batch {batch}")
            timings = time_interleaved({"eager": synced(eager, device), "predictor": synced(served, device)},
                                       steps=1, repeats=args.shape["predictor_repeats"], warmup=2)
            out["rows"][str(batch)] = {"max_abs_diff": diff, "eager_ms": 1e3 * timings["eager"].median,
                                       "predictor_ms": 1e3 * timings["predictor"].median,
                                       "predictor_over_eager": timings["predictor"].median / timings["eager"].median}
    return out


SECTIONS = {"train": section_train, "recompute": section_recompute, "largest_batch": section_largest_batch,
            "to_static_decode": section_to_static_decode, "predictor": section_predictor}
# A section starts only while the time used so far is below this share of the budget, so the
# later, cheaper ones still run when the training section runs long (train always starts).
START_BEFORE = {"train": 1.0, "recompute": 0.55, "largest_batch": 0.7, "to_static_decode": 0.85, "predictor": 0.92}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    wanted = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    peak = device_peak_flops(device, torch.bfloat16)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "gpu", "timestamp": timestamp(), "torch_version": torch.__version__, "quick": args.quick,
        "device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "machine": machine_info(), "peak_bf16_flops": peak, "budget_s": args.budget_s, "sections": {},
    }
    if device.type == "cpu":  # how the processor's figure was worked out (None: unknown, no MFU)
        processor = cpu_peak(torch.bfloat16)
        result["peak_bf16_source"] = processor.describe() if processor else None
    failed = []
    for name in wanted:
        used = time.perf_counter() - started
        if used > START_BEFORE[name] * args.budget_s:
            result["sections"][name] = {"skipped": f"budget: {used:.0f} s of {args.budget_s:.0f} s used"}
            print(f"gpu.py: {name}: skipped (budget)", flush=True)
            continue
        print(f"gpu.py: {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            section = SECTIONS[name](args, device, peak)
            section["wall_s"] = time.perf_counter() - t0
            if section.get("errors"):
                failed.append(name)
        except Exception as err:  # one broken section must not cost the others' figures
            section = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:],
                       "wall_s": time.perf_counter() - t0}
            failed.append(name)
            print(section["traceback"], file=sys.stderr, flush=True)
        free(device)
        result["sections"][name] = section
        print(f"gpu.py: {name}: {section['wall_s']:.0f} s", flush=True)
        if args.out is not None:  # written after every section: a kill still leaves what was measured
            write_json_atomic(args.out, {**result, "wall_s": time.perf_counter() - started, "complete": False})
    result["wall_s"] = time.perf_counter() - started
    result["complete"] = True
    result["failed_sections"] = failed
    if args.out is not None:
        print(f"wrote {write_json_atomic(args.out, result)}")
    report(result)
    return 1 if failed else 0


def report(result: dict[str, Any]) -> None:
    """A short text summary of the figures (the JSON holds everything)."""
    sections = result["sections"]
    train = sections.get("train", {})
    for name, row in train.items():
        if not isinstance(row, dict) or "eager" not in row:
            continue
        for mode in ("eager", "compiled"):
            if mode in row:
                sides = row[mode]["sides"]
                mfu = {s: (f"{100 * v['mfu']:.3g}%" if v["mfu"] is not None else "n/a") for s, v in sides.items()}
                gemm = {s: f"{100 * v['gemm_share']:.3g}%" for s, v in sides.items()}
                print(f"{name} {mode}: sampan {sides['sampan']['median_step_s'] * 1e3:.1f} ms MFU {mfu['sampan']} "
                      f"({gemm['sampan']} of the GEMM rate), plain {sides['plain']['median_step_s'] * 1e3:.1f} ms "
                      f"MFU {mfu['plain']} ({gemm['plain']})")
    for name, section in sections.items():
        if "error" in section:
            print(f"{name}: FAILED: {section['error']}")
    print(f"wall {result['wall_s']:.0f} s on {result['device_name']}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())

"""The inference predictor's engines on the shipped sentiment model, side by side in one run.

1. Model latency (no tokenizer) at three batch shapes, random ids, every engine checked against
   eager torch first:
   - ``eager``: the fp32 torch model (``torch.inference_mode``), the baseline;
   - ``pt2``: ``Config(backend="torch")``, the ``torch.export`` program;
   - ``ort_exported``: ``Config(fuse=False)``, ONNX Runtime on the graph as exported;
   - ``ort_onnxscript``: onnxscript's ``optimize_for_ort`` as it comes, with ORT's default
     optimizers (what sampan shipped before it split the skip-layer-norms back);
   - ``ort_shipped``: ``Config()``, the default: those fusions minus ``SkipLayerNormalization``,
     whose CPU kernel is slower than the ops it fuses (``sampan.inference.fused``).
2. Where the ORT time goes: ORT's profiler's share of kernel time by op type, for onnxscript's
   graph as it comes and for the shipped one, at the first shape; and the kernel the shipped graph
   avoids, ``SkipLayerNormalization``, against the ``Add`` + ``LayerNormalization`` it is split
   into (run as the shipped sessions run them) and torch's add + layer norm, on one tensor pair.
3. Cold start of a Taskflow in a fresh interpreter (import to first result), with the fused graph
   cached beside the export vs rewritten at load; both after the one-off export.

Blocks alternate between engines (``_common.time_interleaved``); ratios are what count.

    python benchmarks/predictor.py                 # full -> benchmarks/results/predictor.json
    python benchmarks/predictor.py --quick --out /tmp/p.json   # smoke run (used by a test)
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
from pathlib import Path
from typing import Any

import numpy as np
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

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "predictor.json"
FULL = {"shapes": "32x128,4x57,1x20", "repeats": 5, "block_seconds": 0.5, "cold_starts": 3}
QUICK = {"shapes": "2x16", "repeats": 1, "block_seconds": 0.05, "cold_starts": 1}
PROFILED_RUNS = 10
COLD_START = "from sampan.taskflow import Taskflow; Taskflow('sentiment_analysis')('好')"
# Printed after the timed part's result, to record whether that start-up paid torch's import.
TORCH_CHECK = "; import sys; print('torch' in sys.modules)"
AGREE_ATOL = 1e-4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="ernie-mini-sentiment", help="stored model (default: %(default)s)")
    parser.add_argument("--shapes", default=None, help="batch x length list (full: 32x128,4x57,1x20)")
    parser.add_argument("--repeats", type=int, default=None, help="timed blocks per engine and shape (full 5)")
    parser.add_argument("--block-seconds", type=float, default=None,
                        help="about how long one timed block runs (full 0.5)")
    parser.add_argument("--cold-starts", type=int, default=None, help="fresh-interpreter runs per side (full 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (ORT uses one per core)")
    parser.add_argument("--quick", action="store_true", help="one small shape, one block, one cold start")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    args = apply_presets(args, QUICK if args.quick else FULL, DEFAULT_OUT)
    try:
        args.shape_list = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
        if any(len(s) != 2 or min(s) < 1 for s in args.shape_list):
            raise ValueError
    except ValueError:
        parser.error(f"--shapes takes BATCHxLENGTH[,...] with positive sizes, e.g. 32x128,1x20; got {args.shapes!r}")
    return args


def _onnxscript_as_is(export: Path, work: Path):
    """An ORT session on onnxscript's ``optimize_for_ort`` output as it comes (skip-layer-norms
    kept), ORT's default optimizers, and the fusion counts; the graph's path too."""
    import onnx_ir
    import onnxruntime
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    from sampan.inference.backends import ort_session_options

    model, stats = optimize_for_ort(onnx_ir.load(str(export / "inference.onnx")))
    path = work / "onnxscript-as-is.onnx"
    path.write_bytes(onnx_ir.to_proto(model).SerializeToString())
    session = onnxruntime.InferenceSession(str(path), ort_session_options(), providers=["CPUExecutionProvider"])
    return session, {k: int(v) for k, v in stats.items() if v}


def engines(eager_model: torch.nn.Module, export: Path, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """name -> run(ids, mask) -> logits (numpy), and what each engine's graph holds."""
    from sampan.inference import Config, create_predictor

    def eager(ids, mask):
        with torch.inference_mode():
            return eager_model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).numpy()

    pt2 = create_predictor(Config(export, backend="torch"))
    exported = create_predictor(Config(export, fuse=False))
    shipped = create_predictor(Config(export))
    as_is, as_is_fusions = _onnxscript_as_is(export, work)
    runs = {
        "eager": eager,
        "pt2": lambda ids, mask: pt2.run([ids, mask])[0],
        "ort_exported": lambda ids, mask: exported.run([ids, mask])[0],
        "ort_onnxscript": lambda ids, mask: as_is.run(None, {"input_ids": ids, "attention_mask": mask})[0],
        "ort_shipped": lambda ids, mask: shipped.run([ids, mask])[0],
    }
    return runs, {"ort_onnxscript": as_is_fusions, "ort_shipped": shipped.fusions}


def _batch(batch: int, length: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch * 1000 + length)
    ids = rng.integers(1, vocab, (batch, length), dtype=np.int64)
    mask = np.ones_like(ids)
    if batch > 1:  # one padded row, as a real batch of unequal reviews has
        mask[-1, length // 2:] = 0
    return ids, mask


def latency(runs: dict[str, Any], shapes: list[tuple[int, int]], vocab: int, args: argparse.Namespace) -> dict:
    out: dict[str, Any] = {}
    for batch, length in shapes:
        ids, mask = _batch(batch, length, vocab)
        expected = runs["eager"](ids, mask)
        agreement = {name: float(np.abs(run(ids, mask) - expected).max()) for name, run in runs.items()}
        wrong = {k: v for k, v in agreement.items() if v > AGREE_ATOL}
        if wrong:
            raise SystemExit(f"at {batch}x{length} these engines differ from eager by more than {AGREE_ATOL}: {wrong}")
        start = time.perf_counter()
        runs["eager"](ids, mask)
        steps = max(1, round(args.block_seconds / max(time.perf_counter() - start, 1e-6)))
        timings = time_interleaved({name: (lambda run=run, ids=ids, mask=mask: run(ids, mask)) for name, run in runs.items()},
                                   steps=steps, repeats=args.repeats, warmup=2)
        row: dict[str, Any] = {"steps_per_block": steps, "max_abs_diff_vs_eager": agreement}
        row["ms"] = {name: t.median * 1e3 for name, t in timings.items()}
        row["speedup_over_eager"] = {name: row["ms"]["eager"] / ms for name, ms in row["ms"].items() if name != "eager"}
        row["shipped_over_onnxscript_speedup"] = row["ms"]["ort_onnxscript"] / row["ms"]["ort_shipped"]
        out[f"{batch}x{length}"] = row
        print(f"{batch:>3} x {length:<4} " + "  ".join(f"{k} {v:7.2f} ms" for k, v in row["ms"].items()), flush=True)
    return out


def kernel_shares(graphs: dict[str, tuple[Path, tuple[str, ...]]], shape: tuple[int, int], vocab: int,
                  work: Path) -> dict[str, Any]:
    """ORT's profiler on each graph (path, disabled ORT optimizers): milliseconds of kernel time per
    run and each op type's share of it, over PROFILED_RUNS runs of one batch."""
    import onnxruntime

    from sampan.inference.backends import ort_session_options

    ids, mask = _batch(*shape, vocab)
    out: dict[str, Any] = {"shape": f"{shape[0]}x{shape[1]}"}
    for name, (path, disabled) in graphs.items():
        options = ort_session_options()  # as the shipped sessions are opened, plus the profiler
        options.enable_profiling = True
        options.profile_file_prefix = str(work / f"profile-{name}")
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"],
                                               disabled_optimizers=list(disabled))
        for _ in range(PROFILED_RUNS):
            session.run(None, {"input_ids": ids, "attention_mask": mask})
        by_op: dict[str, float] = {}
        for event in json.loads(Path(session.end_profiling()).read_text()):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                op = event["args"]["op_name"]
                by_op[op] = by_op.get(op, 0.0) + event["dur"]
        total = sum(by_op.values())
        out[name] = {"kernel_ms_per_run": total / PROFILED_RUNS / 1e3,
                     "share": {op: us / total for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])}}
        top = ", ".join(f"{op} {share:.0%}" for op, share in list(out[name]["share"].items())[:4])
        print(f"kernel time {name}: {out[name]['kernel_ms_per_run']:.1f} ms per run ({top})", flush=True)
    return out


def skip_layer_norm_kernel(shape: tuple[int, int], hidden: int, args: argparse.Namespace) -> dict[str, Any]:
    """One residual add + layer norm three ways on a ``shape x hidden`` float tensor pair: ORT's
    ``SkipLayerNormalization``; ``Add`` + ``LayerNormalization`` with ORT's SkipLayerNormFusion off
    (how the shipped sessions run the split graph); torch. Outputs checked equal first."""
    import onnx
    import onnxruntime
    from onnx import TensorProto, helper

    from sampan.inference.fused import ORT_DISABLED_OPTIMIZERS

    dims = [*shape, hidden]
    eps = 1e-12

    def session(nodes, disabled):
        graph = helper.make_graph(nodes, "residual_norm",
                                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims) for n in ("x", "s")],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
                                  [onnx.numpy_helper.from_array(np.ones(hidden, np.float32), "g"),
                                   onnx.numpy_helper.from_array(np.zeros(hidden, np.float32), "b")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"],
                                            disabled_optimizers=list(disabled))

    fused = session([helper.make_node("SkipLayerNormalization", ["x", "s", "g", "b"], ["y"],
                                      domain="com.microsoft", epsilon=eps)], ())
    split = session([helper.make_node("Add", ["x", "s"], ["t"]),
                     helper.make_node("LayerNormalization", ["t", "g", "b"], ["y"], axis=-1, epsilon=eps)],
                    ORT_DISABLED_OPTIMIZERS)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(dims).astype(np.float32) for n in ("x", "s")}
    xt, st = torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["s"])

    def torch_norm():
        with torch.inference_mode():
            return torch.nn.functional.layer_norm(xt + st, (hidden,), eps=eps).numpy()

    contenders = {"ort_skip_layer_norm": lambda: fused.run(None, feeds)[0],
                  "ort_add_layer_norm": lambda: split.run(None, feeds)[0], "torch_add_layer_norm": torch_norm}
    expected = torch_norm()
    for name, run in contenders.items():
        if np.abs(run() - expected).max() > 1e-4:
            raise SystemExit(f"{name} differs from torch's layer norm by more than 1e-4")
    start = time.perf_counter()
    fused.run(None, feeds)
    steps = max(1, round(args.block_seconds / 5 / max(time.perf_counter() - start, 1e-6)))
    timings = time_interleaved(contenders, steps=steps, repeats=args.repeats, warmup=3)
    out: dict[str, Any] = {"tensor": "x".join(str(d) for d in dims), "steps_per_block": steps,
                           "ms": {name: t.median * 1e3 for name, t in timings.items()}}
    out["skip_layer_norm_over_split"] = out["ms"]["ort_skip_layer_norm"] / out["ms"]["ort_add_layer_norm"]
    print("residual + layer norm on " + out["tensor"] + ": " + "  ".join(f"{k} {v:.2f} ms" for k, v in out["ms"].items()),
          flush=True)
    return out


def _fresh_run(home: Path, imported: list[bool]) -> float:
    """Seconds of one fresh interpreter running COLD_START; appends whether it imported torch."""
    # The cold start's caches are the private home's own (a shared $SAMPAN_CACHE would hold them warm).
    env = {**{k: v for k, v in os.environ.items() if k != "SAMPAN_CACHE"}, "SAMPAN_HOME": str(home)}
    start = time.perf_counter()
    run = subprocess.run([sys.executable, "-W", "ignore", "-c", COLD_START + TORCH_CHECK], env=env, check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seconds = time.perf_counter() - start
    imported.append(run.stdout.strip().splitlines()[-1] == "True")
    return seconds


def cold_start(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Seconds from a fresh interpreter to the first sentiment result, in a private SAMPAN_HOME:
    the first run (export + fusion, once per model), then alternately with the fused file cached
    and with it deleted first (the rewrite at load that sampan did before caching it)."""
    home = work / "home"
    torch_imported: dict[str, list[bool]] = {"first_use": [], "cached": [], "rewritten_at_load": []}
    first = _fresh_run(home, torch_imported["first_use"])
    fused = sorted(home.glob("cache/inference/*/inference.ort.onnx"))
    if len(fused) != 1:
        raise SystemExit(f"expected one fused graph under {home}/cache/inference after the first run, found {fused}")
    sides: dict[str, list[float]] = {"cached": [], "rewritten_at_load": []}
    for i in range(args.cold_starts):
        for side in (("cached", "rewritten_at_load") if i % 2 == 0 else ("rewritten_at_load", "cached")):
            if side == "rewritten_at_load":
                fused[0].unlink()
            sides[side].append(_fresh_run(home, torch_imported[side]))
    out = {"first_use_s": first, **{f"{k}_s": statistics.median(v) for k, v in sides.items()},
           "runs_s": sides, "torch_imported": torch_imported, "command": f'python -c "{COLD_START}"'}
    out["cached_speedup"] = out["rewritten_at_load_s"] / out["cached_s"]
    print(f"cold start: first use {first:.2f} s, cached {out['cached_s']:.2f} s, "
          f"rewritten at load {out['rewritten_at_load_s']:.2f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = set_threads(args.threads)
    from sampan.inference import export_pretrained
    from sampan.store.models import resolve
    from sampan.taskflow.runtime import eager_model, quiet_exporter

    model_dir = resolve(args.model)
    results: dict[str, Any] = {"benchmark": "predictor", "timestamp": timestamp(), "machine": machine_info(),
                               "quick": bool(args.quick), "model": args.model, "torch_threads": threads}
    with tempfile.TemporaryDirectory(prefix="sampan-bench-predictor-") as tmp:
        work = Path(tmp)
        model = eager_model(model_dir)
        vocab = int(model.config.vocab_size)
        with quiet_exporter():
            export = export_pretrained(model, work / "export", overwrite=True)
        runs, fusions = engines(model, export, work)
        results["fusions"] = fusions
        results["latency"] = latency(runs, args.shape_list, vocab, args)
        from sampan.inference.fused import ORT_DISABLED_OPTIMIZERS

        results["kernel_time"] = kernel_shares(
            {"ort_onnxscript": (work / "onnxscript-as-is.onnx", ()),
             "ort_shipped": (export / "inference.ort.onnx", ORT_DISABLED_OPTIMIZERS)},
            args.shape_list[0], vocab, work)
        results["skip_layer_norm_kernel"] = skip_layer_norm_kernel(args.shape_list[0], int(model.config.hidden_size),
                                                                   args)
        results["cold_start"] = cold_start(args, work)
    results["load_average_end"] = load_average()
    write_json_atomic(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

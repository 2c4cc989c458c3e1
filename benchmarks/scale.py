"""Today's 100B+ layouts, simulated with fleet's own code and priced by the planner, side by side.

For each layout below, ``sampan simulate`` runs one training step of the first and the last
pipeline rank (of every pipeline rank for the MoE layouts: fleet's real code under torch's fake
process group and fake tensors, docs/scale.md) and ``sampan plan``'s memory model prices the same
ranks. Written: every rank's simulated and
planned bytes, their ratio, what was alive at the peak, and how long each rank took here.

    python benchmarks/scale.py                     # all layouts (about 20 minutes on 2 cores)
    python benchmarks/scale.py --only llama3-405b-meta-features
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import machine_info, timestamp, write_json_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# name -> (model, GPUs, --fix, seq len, global batch, what it is)
META = "dp=1,sharding=64,stage=2,mp=8,pp=16,micro_batch=1,schedule=interleaved,vpp=2"
LAYOUTS = {
    "gpt3-175b-megatron": ("gpt-175b", 1024, "dp=8,mp=8,pp=16,micro_batch=1", 2048, 1536,
                           "GPT-3 175B at Megatron's t8 x p16 x d8, 1F1B, 192 micro-batches, O1, no recompute"),
    "gpt3-175b-megatron-full": ("gpt-175b", 1024, "dp=8,mp=8,pp=16,micro_batch=1,recompute=full", 2048, 1536,
                                "the same with full recompute"),
    "llama3-405b-meta": ("llama3-405b", 8192, META, 8192, 2048,
                         "Llama 3 405B at Meta's t8 x p16 x d64 (ZeRO-2 over 64), interleaved v2, O1, no recompute"),
    "llama3-405b-meta-full": ("llama3-405b", 8192, META + ",recompute=full", 8192, 2048,
                              "the same with full recompute"),
    "llama3-405b-meta-features": ("llama3-405b", 8192, META + ",sp=true,amp=O2,recompute=full", 8192, 2048,
                                  "the same with sequence parallel, bf16 parameters (O2) and full recompute"),
    "llama3-405b-meta-offload": ("llama3-405b", 8192, META + ",sp=true,amp=O2,recompute=full,offload=true", 8192, 2048,
                                 "the same with activation offload (the blocks' inputs in host memory)"),
    "llama3-405b-meta-128k": ("llama3-405b", 16384,
                              "dp=1,sharding=8,stage=2,cp=16,mp=8,pp=16,micro_batch=1,schedule=interleaved,vpp=2,"
                              "sp=true,amp=O2,recompute=full", 131072, 128,
                              "Meta's long-context stage: t8 x cp16 x p16 x d8 at 128K tokens, sequence parallel, "
                              "O2, full recompute"),
    "deepseek-v3-published": ("deepseek-v3", 2048,
                              "dp=1,sharding=128,stage=1,pp=16,ep=64,micro_batch=1,recompute=full,amp=O2", 4096, 15360,
                              "DeepSeek-V3 at its published pp16 x ep64 x ZeRO-1 dp128 on 2,048 GPUs, O2, full "
                              "recompute, routing 1.1x the mean on the simulated ranks"),
    "ernie4.5-300b-published": ("ernie4.5-300b-a47b", 2016,
                                "dp=1,sharding=168,stage=1,pp=12,ep=8,micro_batch=1,recompute=full,amp=O2", 4096, 4032,
                                "ERNIE-4.5-300B-A47B at its published pp12 x sharding168 (ZeRO-1) with ep8 on 2,016 "
                                "GPUs, O2, full recompute"),
}
# MoE stages differ in their dense / MoE layer mix: every pipeline rank is simulated, not only the ends.
EVERY_STAGE = {"deepseek-v3-published", "ernie4.5-300b-published"}


def run_one(name: str) -> dict:
    model, gpus, fix, seq, batch, what = LAYOUTS[name]
    cmd = [sys.executable, "-m", "sampan.cli", "simulate", "--model", model, "--gpus", str(gpus), "--fix", fix,
           "--seq-len", str(seq), "--global-batch", str(batch), "--json"]
    if name in EVERY_STAGE:
        cmd += ["--stages", "all"]
    start = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if run.returncode != 0:
        raise RuntimeError(f"{name}: sampan simulate failed:\n{run.stderr[-3000:]}")
    report = json.loads(run.stdout)
    ranks = []
    for row in report["ranks"]:
        sim, plan = row["simulated_bytes"], row["planned_bytes"]
        ranks.append({"rank": row["rank"], "pipeline_rank": row["coords"]["pp"], "stages": row["stages"],
                      "micro_batches_run": row["num_micro_run"], "seconds": row["seconds"],
                      "simulated": sim, "planned": plan, "sim_over_plan": sim["total"] / plan["total"],
                      "largest_at_peak": row["peak_breakdown"][:6]})
    return {"what": what, "command": "sampan " + " ".join(cmd[3:]), "label": report["label"],
            "worst_needs_gb": report["worst_needs_bytes"] / 1e9, "fits_80gb": report["fits"],
            "ranks": ranks, "wall_s": time.perf_counter() - start}


def summarize(layouts: dict) -> dict:
    """The figures the README quotes: the range of simulated / planned over every rank, and what
    Llama 3 405B needs at Meta's layout with and without the memory features."""
    ratios = [r["sim_over_plan"] for layout in layouts.values() for r in layout["ranks"]]
    return {"ranks": len(ratios), "layouts": len(layouts), "min_sim_over_plan": min(ratios),
            "max_sim_over_plan": max(ratios),
            "llama3_405b_features_needs_gb": layouts["llama3-405b-meta-features"]["worst_needs_gb"],
            "llama3_405b_full_needs_gb": layouts["llama3-405b-meta-full"]["worst_needs_gb"],
            "llama3_405b_offload_needs_gb": layouts["llama3-405b-meta-offload"]["worst_needs_gb"],
            "llama3_405b_128k_needs_gb": layouts["llama3-405b-meta-128k"]["worst_needs_gb"],
            "deepseek_v3_needs_gb": layouts["deepseek-v3-published"]["worst_needs_gb"],
            "ernie4_5_300b_needs_gb": layouts["ernie4.5-300b-published"]["worst_needs_gb"],
            "slowest_rank_s": max(r["seconds"] for layout in layouts.values() for r in layout["ranks"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(LAYOUTS), help="run this layout (repeatable)")
    parser.add_argument("--out", default=str(RESULTS / "scale.json"))
    args = parser.parse_args()
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.is_file() and args.only else {"layouts": {}}
    for name in args.only or LAYOUTS:
        result = run_one(name)
        report["layouts"][name] = result
        worst = max(abs(r["sim_over_plan"] - 1) for r in result["ranks"])
        print(f"{name}: needs {result['worst_needs_gb']:.1f} GB ({'fits' if result['fits_80gb'] else 'does not fit'} "
              f"80 GB); simulated / planned "
              + ", ".join(f"rank {r['rank']} {r['sim_over_plan']:.3f}" for r in result["ranks"])
              + f" (worst {worst:.1%}); {result['wall_s']:.0f} s", flush=True)
    if set(report["layouts"]) == set(LAYOUTS):
        report["summary"] = summarize(report["layouts"])
    report.update(benchmark="scale", timestamp=timestamp(), machine=machine_info())
    write_json_atomic(out, report)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

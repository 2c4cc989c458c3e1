"""``sampan plan --from-run OUTPUT_DIR``: where a finished run's step time went, next to the prediction.

What a Trainer run leaves behind, and what is read from it:

* ``metrics.jsonl``: per logged window ``step_time_sec``, ``tokens_per_sec``, ``data_wait_pct``
  (time blocked on the data loader) and, when the Trainer priced it, ``mfu``. The first window
  (warm-up: allocator, kernel selection) is left out when there are others; the median of the rest
  is used.
* the newest ``checkpoint-*/trainer_state.json``: the ``TrainingArguments`` (micro-batch,
  accumulation, AMP, recompute, ``strategy``, ``peak_flops``), the data loader's replicas and, on
  fleet, the world size and the resolved dp / sharding / pp / mp degrees.
* ``model/config.json`` (``save_pretrained``, as ``sampan train`` writes at the end) for the
  shape, unless ``--model`` / ``--model-shape`` is given.

Measured apart: the step time and the data wait. The Trainer does not time compute,
communication and the pipeline bubble apart (they interleave inside ``forward_backward``), so
the rest of the step is split in the proportions the planner predicts for the same layout, and
the output says so. On a CPU run (no ``--hardware`` / ``--gpu-*`` given) the "hardware" is this
machine: matmuls at the run's ``peak_flops`` if it set one, else at a GEMM rate measured now (the
processor's peak its MFU was priced against is a ceiling, reported beside it), one node, gloo over
loopback at an assumed bandwidth, collectives on the critical path (CPU ranks don't overlap).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sampan.planner.hardware import Hardware, get_hardware
from sampan.planner.layout import Layout, Workload
from sampan.planner.model_shape import ModelShape
from sampan.planner.search import Plan, evaluate

if TYPE_CHECKING:
    from sampan.planner.job import GpuChoice

CPU_LINK_GBYTES_PER_S = 1.0
"""Assumed one-way gloo bandwidth between ranks of one machine (loopback TCP); not measured."""
CPU_LINK_LATENCY_US = 100.0
"""Assumed per-message gloo latency on one machine; not measured."""

COMPONENTS = (("compute", "compute"), ("tensor_parallel", "tensor-parallel comm"), ("bubble", "pipeline bubble"),
              ("pipeline_p2p", "pipeline p2p"), ("data_parallel", "data-parallel / sharding comm"),
              ("optimizer", "optimizer step"))


# Where a CPU run's peak came from when it set no ``peak_flops``: its MFU's denominator.
PROCESSOR_PEAK = "the processor peak the Trainer priced its MFU against"


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What a finished run measured, and the layout it ran."""

    output_dir: str
    steps: int
    windows: int
    """Logged windows used (the warm-up window left out when there are more)."""
    step_time_s: float
    data_wait_s: float
    tokens_per_s: float
    mfu: float | None
    world_size: int
    layout: Layout
    workload: Workload
    peak_flops_per_rank: float | None
    """The peak FLOP/s the Trainer priced MFU against, per rank (None when it did not)."""
    peak_source: str


def _decode(node: Any) -> Any:
    """sampan's checkpoint JSON (``state_codec``) back to plain values; tensors and arrays become None."""
    if isinstance(node, list):
        return [_decode(v) for v in node]
    if not isinstance(node, dict):
        return node
    if "$dict" in node:
        return {k: _decode(v) for k, v in node["$dict"].items()}
    if "$tuple" in node:
        return tuple(_decode(v) for v in node["$tuple"])
    if "$items" in node:
        return {k: _decode(v) for k, v in node["$items"]}
    if "$float" in node:
        return float(node["$float"])
    return None  # $tensor / $ndarray / $bytes: not needed here


def _trainer_state(output_dir: Path) -> dict[str, Any]:
    checkpoints = sorted((p for p in output_dir.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                         key=lambda p: int(p.name.rpartition("-")[2]) if p.name.rpartition("-")[2].isdigit() else -1)
    if not checkpoints:
        raise ValueError(f"{output_dir} has no checkpoint-*/trainer_state.json: --from-run needs a finished Trainer run "
                         "(the Trainer writes a checkpoint at the end of train())")
    raw = json.loads((checkpoints[-1] / "trainer_state.json").read_text(encoding="utf-8"))
    return _decode(raw.get("root", raw))


def _train_windows(output_dir: Path) -> list[dict[str, Any]]:
    path = output_dir / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} not found: --from-run needs a Trainer output directory (metrics.jsonl)")
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if row.get("kind") == "train" and row.get("step_time_sec") and row.get("tokens_per_sec"):
            rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no training windows with step_time_sec / tokens_per_sec")
    return rows[1:] if len(rows) > 1 else rows


def _layout(args: dict[str, Any], saved: dict[str, Any]) -> tuple[Layout, int]:
    degrees = saved.get("degrees") or {"dp": 1, "sharding": 1, "pp": 1, "cp": 1, "mp": 1}
    world = int(saved.get("world_size") or math.prod(degrees.values()))
    layout = Layout.from_strategy(args.get("strategy") or {}, degrees,
                                  micro_batch=int(args["per_device_train_batch_size"]),
                                  num_micro=int(args.get("gradient_accumulation_steps", 1)),
                                  recompute=args.get("recompute") or None)
    return layout, world


def read_run(output_dir: str | os.PathLike, model: ModelShape, seq_len: int | None = None) -> RunRecord:
    """Read a finished run (see the module docstring). ``seq_len`` None: derived from the tokens per step."""
    out = Path(output_dir)
    if not out.is_dir():
        raise ValueError(f"--from-run {output_dir!r} is not a directory")
    windows = _train_windows(out)
    saved = _trainer_state(out)
    args = saved.get("args") or {}
    if "per_device_train_batch_size" not in args:
        raise ValueError(f"{out}: the checkpoint's trainer state has no training arguments (not a sampan Trainer run?)")
    layout, world = _layout(args, saved)
    step_s = statistics.median(w["step_time_sec"] for w in windows)
    tokens_s = statistics.median(w["tokens_per_sec"] for w in windows)
    wait_s = statistics.median(w.get("data_wait_pct", 0.0) / 100 * w["step_time_sec"] for w in windows)
    global_batch = layout.micro_batch * layout.num_micro * layout.data_ranks
    if seq_len is None:  # the Trainer counts every token of a batch without an attention mask
        per_step = statistics.median(w["tokens_per_sec"] * w["step_time_sec"] for w in windows)
        seq_len = max(1, round(per_step / global_batch))
    amp = args.get("amp")
    work = Workload(seq_len, global_batch, "bf16" if amp in ("bf16", "fp16") else None)
    mfus = [w["mfu"] for w in windows if w.get("mfu")]
    mfu = statistics.median(mfus) if mfus else None
    peak, source = None, "not recorded"
    if isinstance(args.get("peak_flops"), (int, float)) and args["peak_flops"] > 0:
        peak, source = float(args["peak_flops"]), "the run's peak_flops"
    elif mfu:  # the Trainer priced MFU against the processor's peak times the world size: recover it
        peak = statistics.median(w["tokens_per_sec"] * model.flops_per_token(seq_len) / w["mfu"]
                                 for w in windows if w.get("mfu")) / world
        source = PROCESSOR_PEAK
    return RunRecord(str(out), int(saved.get("state", {}).get("global_step", windows[-1]["step"])), len(windows),
                     step_s, wait_s, tokens_s, mfu, world, layout, work, peak, source)


def cpu_hardware(run: RunRecord, overrides: dict[str, float | None]) -> tuple[Hardware, list[str]]:
    """This machine as the planner's hardware, with the assumptions said."""
    notes = []
    tflops = overrides.get("tflops")
    if tflops is None:
        peak = run.peak_flops_per_rank
        if peak is None or run.peak_source == PROCESSOR_PEAK:
            # The processor's peak is a ceiling no CPU matmul reaches (vector units flat out at the
            # turbo clock), so compute is priced at the rate a GEMM reaches here now. Imports torch.
            import torch

            from sampan.utils.hardware import measure_gemm_flops

            ceiling = peak
            peak = measure_gemm_flops(torch.bfloat16 if run.workload.amp else torch.float32)
            why = ("the run recorded none" if ceiling is None else
                   f"the processor's peak, {ceiling / 1e9:.1f} GFLOP/s per rank, is a ceiling, not a rate")
            notes.append(f"matmul rate {peak / 1e9:.1f} GFLOP/s measured now on this machine ({why})")
        else:
            notes.append(f"matmul rate {peak / 1e9:.1f} GFLOP/s per rank: {run.peak_source}")
        cores = os.cpu_count() or 1
        if run.world_size > cores:  # ranks share the cores
            peak *= cores / run.world_size
            notes.append(f"{run.world_size} ranks share {cores} cores: each gets {cores / run.world_size:.2f} of that")
        tflops = peak / 1e12
    gbps = overrides.get("intra_node_gbps")
    if gbps is None:
        gbps = 2 * CPU_LINK_GBYTES_PER_S / 0.8  # (both directions, before link_efficiency) -> 1 GB/s one way
        notes.append(f"gloo between ranks: {CPU_LINK_GBYTES_PER_S:g} GB/s one way, {CPU_LINK_LATENCY_US:g} us per "
                     "message (assumed, not measured; --intra-node-gbps overrides)")
    eff = overrides.get("matmul_efficiency") or 1.0
    notes.append(f"matmul efficiency {eff:g} of that rate (--matmul-efficiency overrides); collectives not overlapped")
    hw = Hardware("cpu (this machine)", gpus_per_node=max(1, run.world_size), memory_gb=1e6, tflops=tflops,
                  intra_node_gbps=gbps, inter_node_gbps=8 * CPU_LINK_GBYTES_PER_S, hbm_gbps=20.0,
                  host_gbps=20.0,  # offload on the CPU copies within the same memory, at the bandwidth assumed
                  latency_intra_us=CPU_LINK_LATENCY_US, latency_inter_us=CPU_LINK_LATENCY_US, matmul_efficiency=eff)
    notes.append("optimizer step (and offload's copies) priced at an assumed 20 GB/s of memory bandwidth")
    return hw, notes


def compare(run: RunRecord, model: ModelShape, hw: Hardware, overlap: bool) -> dict[str, Any]:
    """The run's step split next to the prediction for the same model, layout and hardware."""
    plan: Plan = evaluate(model, run.layout, run.workload, hw, overlap)
    t = plan.time
    rest = max(run.step_time_s - run.data_wait_s, 0.0)
    rows = []
    for key, label in COMPONENTS:
        predicted = getattr(t, key)
        rows.append({"component": label, "predicted_s": predicted, "predicted_share": predicted / t.total,
                     "run_s": rest * predicted / t.total, "run_share": rest * predicted / t.total / run.step_time_s,
                     "run_source": "attributed (model's split of the measured non-wait time)"})
    rows.append({"component": "data wait", "predicted_s": 0.0, "predicted_share": 0.0, "run_s": run.data_wait_s,
                 "run_share": run.data_wait_s / run.step_time_s, "run_source": "measured (data_wait_pct)"})
    flops_step = model.flops_per_token(run.workload.seq_len) * run.workload.tokens
    predicted_mfu = flops_step / t.total / (run.world_size * hw.peak_flops)
    measured_mfu = flops_step / run.step_time_s / (run.world_size * hw.peak_flops)
    return {
        "run": {"output_dir": run.output_dir, "steps": run.steps, "windows_used": run.windows,
                "world_size": run.world_size, "layout": run.layout.to_dict(),
                "seq_len": run.workload.seq_len, "global_batch": run.workload.global_batch, "amp": run.workload.amp,
                "step_time_s": run.step_time_s, "data_wait_s": run.data_wait_s, "tokens_per_s": run.tokens_per_s,
                "mfu_logged": run.mfu},
        "model": model.to_dict(), "hardware": dataclasses.asdict(hw),
        "predicted": {"step_time_s": t.total, "tokens_per_s": run.workload.tokens / t.total, "mfu": predicted_mfu,
                      "memory_gb": plan.memory.total / 1e9, "bottleneck": t.bottleneck},
        "measured_mfu_vs_this_hardware": measured_mfu,
        "step_time_ratio_measured_over_predicted": run.step_time_s / t.total,
        "breakdown": rows,
        "not_measured": "the Trainer times the whole step and the data wait only; compute, communication and the "
                        "pipeline bubble overlap inside forward_backward and are split here by the model's proportions",
    }


def print_comparison(report: dict[str, Any], notes: list[str], console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(Console().width, 120))
    run, pred = report["run"], report["predicted"]
    lay = Layout(**run["layout"])
    title = (f"{report['model']['name']} · {lay.label()} · {lay.schedule_label()} · micro-batch {lay.micro_batch} x "
             f"{lay.num_micro} · recompute {lay.recompute} · seq {run['seq_len']} · {report['hardware']['name']}")
    table = Table(title=f"where the step went: {run['output_dir']}\n{title}")
    for col, justify in (("component", "left"), ("predicted s", "right"), ("predicted %", "right"),
                         ("run s", "right"), ("run %", "right"), ("run figure is", "left")):
        table.add_column(col, justify=justify)
    for row in report["breakdown"]:
        source = "measured" if row["run_source"].startswith("measured") else "attributed *"
        table.add_row(row["component"], f"{row['predicted_s']:.4f}", f"{row['predicted_share']:.1%}",
                      f"{row['run_s']:.4f}", f"{row['run_share']:.1%}", source)
    table.add_row("[bold]step[/bold]", f"[bold]{pred['step_time_s']:.4f}[/bold]", "100%",
                  f"[bold]{run['step_time_s']:.4f}[/bold]", "100%", "measured")
    console.print(table)
    ratio = report["step_time_ratio_measured_over_predicted"]
    console.print(f"tokens/s: run {run['tokens_per_s']:,.0f}, predicted {pred['tokens_per_s']:,.0f}; the run's step "
                  f"took {ratio:.2f}x the prediction. MFU vs this hardware: run "
                  f"{report['measured_mfu_vs_this_hardware']:.1%}, predicted {pred['mfu']:.1%}.")
    console.print("* the run's measured step minus its data wait, split in the model's proportions")
    for note in notes:
        console.print(f"assumption: {note}")
    console.print(f"not measured: {report['not_measured']}")


def hardware_for_run(run: RunRecord, preset: str | None, overrides: dict[str, float | None]) -> tuple[Hardware, list[str],
                                                                                                       bool]:
    """``(hardware, assumptions, overlap)``: the given GPU cluster, or this CPU when none is given."""
    if preset is not None or any(overrides.get(k) is not None for k in ("tflops", "memory_gb", "inter_node_gbps",
                                                                         "gpus_per_node")):
        hw = get_hardware(preset, **overrides)
        return hw, [f"hardware {hw.name}: {hw.tflops:g} TFLOP/s, as given"], True
    hw, notes = cpu_hardware(run, overrides)
    return hw, notes, False


def report_for_run(output_dir: str | os.PathLike, model: str | None, model_shape: str | None,
                   seq_len: int | None, gpus: GpuChoice) -> tuple[dict[str, Any], list[str]]:
    """``sampan plan --from-run``: a finished run's measured step next to the prediction for its
    layout, and the assumptions made (``(report, notes)``). The model is the run's
    ``model/config.json`` unless ``model`` (a name or config file) or ``model_shape`` names it."""
    from sampan.planner.model_shape import load_model

    out = Path(output_dir)
    if model is None and model_shape is None:
        config = out / "model" / "config.json"
        if not config.is_file():
            raise ValueError(f"{out} has no model/config.json (save_pretrained); give the run's model with --model "
                             "NAME_OR_CONFIG or --model-shape")
        shape = dataclasses.replace(load_model(str(config)), name=f"{out.name} (model/config.json)")
    else:
        shape = load_model(model, model_shape)
    record = read_run(out, shape, seq_len)
    hw, notes, overlap = hardware_for_run(record, gpus.hardware, gpus.overrides())
    report = compare(record, shape, hw, overlap)
    report["assumptions"] = notes
    return report, notes

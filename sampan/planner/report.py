"""What ``sampan plan`` prints and writes: a rich table, JSON, and a run file for ``sampan train``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from sampan.planner.hardware import Hardware
from sampan.planner.layout import Workload
from sampan.planner.memory import expert_shard_divisor
from sampan.planner.model_shape import ModelShape
from sampan.planner.search import Plan, SearchResult
from sampan.planner.simulation import COMPONENTS, GB
from sampan.utils.atomic import atomic_write


def _gb(nbytes: float | None, unit: float = GB, fmt: str = ".1f") -> str:
    """Bytes in ``unit`` (GB by default) as ``fmt`` gives them; "-" for a figure that is not there."""
    if nbytes is None or (isinstance(nbytes, float) and math.isnan(nbytes)):
        return "-"
    return f"{nbytes / unit:{fmt}}"


def plan_row(plan: Plan) -> dict[str, Any]:
    """The table's columns for one plan, as plain values (JSON's ``rows``)."""
    lay = plan.layout
    return {"dp": lay.dp, "sharding": lay.sharding, "zero_stage": lay.stage if lay.shard_ranks > 1 else None,
            "pp": lay.pp, "cp": lay.cp, "mp": lay.mp, "sequence_parallel": lay.sp, "amp_level": lay.amp_level,
            "master_weights": lay.master_weights, "master_grads": lay.master_grads,
            "vpp": lay.vpp, "schedule": lay.schedule_label(),
            "micro_batch": lay.micro_batch, "micro_batches": lay.num_micro, "recompute": lay.recompute,
            "offload": lay.offload,
            "memory_gb": plan.memory.total / 1e9, "step_s": plan.time.total, "tokens_per_s": plan.tokens_per_s,
            "mfu": plan.mfu, "bottleneck": plan.time.bottleneck, "fits": plan.fits,
            **({"ep": lay.ep, "expert_state_gb": plan.memory.expert_state / 1e9,
                "all_to_all_s": plan.time.expert_parallel} if plan.memory.expert_state else {})}


def to_json(model: ModelShape, hw: Hardware, work: Workload, gpus: int, plans: list[Plan],
            result: SearchResult | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": model.to_dict(), "hardware": hw.__dict__ | {}, "gpus": gpus,
        "workload": {"seq_len": work.seq_len, "global_batch": work.global_batch, "amp": work.amp,
                     "tokens_per_step": work.tokens},
        "compute_efficiency": hw.efficiency(model.hidden),
        "compute_efficiency_source": "--matmul-efficiency" if hw.matmul_efficiency is not None else
        f"width curve {hw.efficiency_max:.4f} * h / (h + {hw.efficiency_h0:.1f}) (docs/planner.md)",
        "rows": [plan_row(p) for p in plans], "plans": [p.to_dict() for p in plans]}
    if result is not None:
        out["search"] = {"considered": result.considered, "fitting": result.fitting, "seconds": result.seconds}
    return out


def print_table(model: ModelShape, hw: Hardware, work: Workload, gpus: int, plans: list[Plan],
                result: SearchResult | None = None, console=None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=max(Console().width, 150))  # a piped table stays readable
    title = (f"{model.name} ({model.num_parameters / 1e9:.1f}B) on {gpus} x {hw.name} "
             f"({hw.memory_gb:g} GB, {hw.tflops:g} TFLOP/s) · seq {work.seq_len} · global batch {work.global_batch}"
             f"\n{model.describe()}")
    table = Table(title=title)
    moe = model.moe is not None  # MoE: the expert-parallel degree, expert state and all-to-all time too
    columns = [("#", "right"), ("dp", "right"), ("shard", "right"), ("pp", "right"), ("cp", "right"),
               ("mp", "right"), *([("ep", "right")] if moe else []), ("amp", "left"), ("schedule", "left"),
               ("mb x n", "right"), ("recompute", "left"), ("mem GB/GPU", "right"),
               *([("experts GB", "right"), ("a2a s", "right")] if moe else []), ("step s", "right"),
               ("tokens/s", "right"), ("MFU", "right"), ("bottleneck", "left")]
    for col, justify in columns:
        table.add_column(col, justify=justify)
    for i, plan in enumerate(plans, 1):
        lay = plan.layout
        shard = f"{lay.sharding}" + (f" z{lay.stage}" if lay.shard_ranks > 1 else "")
        mem = _gb(plan.memory.total) if plan.fits else f"[red]{_gb(plan.memory.total)} (> {hw.memory_gb:g})[/red]"
        amp = (lay.amp_level if work.amp else "fp32") + ("" if lay.master_weights else " bf16-state")
        row = [str(i), str(lay.dp), shard, str(lay.pp), str(lay.cp), f"{lay.mp}{'+sp' if lay.sp else ''}",
               *([str(lay.ep)] if moe else []), amp, lay.schedule_label(), f"{lay.micro_batch} x {lay.num_micro}",
               lay.recompute + ("+offload" if lay.offload else ""), mem,
               *([_gb(plan.memory.expert_state), f"{plan.time.expert_parallel:.2f}"] if moe else []),
               f"{plan.time.total:.2f}", f"{plan.tokens_per_s:,.0f}", f"{plan.mfu:.1%}", plan.time.bottleneck]
        table.add_row(*row)
    console.print(table)
    if result is not None:
        console.print(f"{result.considered:,} valid layouts, {result.fitting:,} fit in memory, "
                      f"searched in {result.seconds:.2f} s")
    if plans:
        best = plans[0]
        m, t = best.memory, best.time
        console.print(f"#1 memory/GPU: params {_gb(m.params)} + grads {_gb(m.grads)} + optimizer {_gb(m.optimizer)} + "
                      f"activations {_gb(m.activations)} + buffers {_gb(m.buffers)} + reserved {_gb(m.reserved)} GB "
                      f"(pipeline stage {m.stage})")
        console.print(f"#1 step: compute {t.compute:.2f} + tensor-parallel {t.tensor_parallel:.2f} + bubble {t.bubble:.2f}"
                      f" + p2p {t.pipeline_p2p:.2f} + data-parallel {t.data_parallel:.2f} + optimizer {t.optimizer:.2f}"
                      + (f" + offload copies {t.offload:.2f}" if t.offload else "")
                      + (f" + EP all-to-all {t.expert_parallel:.2f}" if t.expert_parallel else "") + " s")
        if m.expert_state:
            ranks, divisor = best.layout.expert_shard_ranks, expert_shard_divisor(model, best.layout)
            padded = (f", FSDP2 padding each to 1/{divisor:.3g} of the local experts: no dimension splits in {ranks}"
                      if abs(divisor - ranks) > 1e-9 else "")
            console.print(f"#1 routed experts: {_gb(m.expert_state)} GB of the model state ({best.layout.ep} "
                          f"expert-parallel ranks, state sharded over {ranks}{padded}); router "
                          f"imbalance {work.moe_load_factor:g}, dispatch {work.moe_dispatch}, all-to-all "
                          f"{work.a2a_overlap:.0%} hidden" + (", FP8 GEMMs" if work.fp8 else ""))
        how = "as given" if hw.matmul_efficiency is not None else f"width curve at h={model.hidden}"
        console.print(f"compute priced at {hw.efficiency(model.hidden):.1%} of peak ({how}; docs/planner.md)")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):  # e.g. Llama 3.1's three eos_token_id values
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _toml_tables(data: dict[str, Any], prefix: str = "") -> list[str]:
    lines, nested = [], []
    for key, value in data.items():
        if isinstance(value, dict):
            nested.append((key, value))
        elif value is not None:  # TOML has no null
            lines.append(f"{key} = {_toml_value(value)}")
    out = ([f"[{prefix}]"] if prefix and lines else []) + lines
    for key, value in nested:
        out += ([""] if out else []) + _toml_tables(value, f"{prefix}.{key}" if prefix else key)
    return out


SHAPE_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                "tie_word_embeddings")
"""Config fields a ``[model]`` table always spells out when it overrides a base config, so that
none is re-derived from the others by ``get_config``'s ``replace`` (a head_dim or an MLP width
that followed the base's hidden size)."""


def _closest_config(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``[model]`` for a config that is not a registered name: the registered config of its
    family it differs least from, and the differences. Returns the table and header notes."""
    from sampan.models.registry import get_config, list_models

    best = None
    for name in list_models():
        base = get_config(name)
        if base.model_type != config.get("model_type"):
            continue
        base_fields = base.to_dict()
        diff = {k: v for k, v in config.items() if k != "model_type" and base_fields.get(k) != v}
        unsaid = sorted(k for k, v in diff.items() if v is None)  # TOML has no null to say them with
        key = (len(unsaid), len(diff))
        if best is None or key < best[0]:
            best = (key, name, diff, unsaid)
    if best is None:
        raise ValueError(f"no registered config of model_type {config.get('model_type')!r} to base a run file on")
    _, name, diff, unsaid = best
    table: dict[str, Any] = {"name": name, **{k: v for k, v in diff.items() if v is not None}}
    if diff:
        table |= {k: config[k] for k in SHAPE_FIELDS if k in config}
    notes = [f"# [model] {', '.join(unsaid)}: none in the planned config, which TOML cannot say; {name}'s value "
             "is kept (it does not change the plan)."] if unsaid else []
    return table, notes


def model_table(model: ModelShape, work: Workload, mp: int) -> tuple[dict[str, Any], list[str]]:
    """The run file's ``[model]`` table (a registered name and overrides, as ``sampan train`` and
    ``sampan.models.get_config`` read it) and header notes for it."""
    notes: list[str] = []
    if model.registered is not None:
        table: dict[str, Any] = {"name": model.registered}
    elif model.config is not None:  # a config file (any family) or an inline Llama-style shape
        table, notes = _closest_config(dict(model.config))
    else:  # an inline GPT shape: a GPT with these fields
        table = {"name": "gpt-small", "num_layers": model.layers, "hidden_size": model.hidden,
                 "num_heads": model.heads, "intermediate_size": model.ffn, "tie_word_embeddings": model.tied}
    vocab = model.padded_vocab(mp)
    table["vocab_size"] = vocab
    table["max_position_embeddings"] = max(work.seq_len, model.max_positions)
    if vocab != model.vocab:
        notes.append(f"# vocab_size padded from {model.vocab} to {vocab} so mp={mp} divides it.")
    return table, notes


def run_file_text(model: ModelShape, work: Workload, plan: Plan) -> str:
    """A run file (``[model] [data] [training] [strategy]``) that ``sampan train --config`` accepts.

    ``[model]`` names the registered config the model came from (or the closest one of its
    family, with the fields that differ), so a Llama / Qwen plan trains that family's model.
    """
    lay = plan.layout
    table, notes = model_table(model, work, lay.mp)
    vocab = table["vocab_size"]
    strategy = lay.to_strategy(work.amp).to_dict()
    strategy["pipeline_configs"].pop("accumulate_steps")  # the Trainer's gradient_accumulation_steps sets it
    strategy.pop("amp", None)  # [training] amp sets it
    strategy.pop("recompute", None)  # [training] recompute sets it
    doc = {
        "model": table,
        "data": {"corpus": "", "token_file": "data/train.bin", "token_dtype": "uint32" if vocab > 65535 else "uint16",
                 "vocab_size": vocab, "seq_len": work.seq_len},
        "training": {"output_dir": "outputs/plan", "max_steps": 1000,
                     "per_device_train_batch_size": lay.micro_batch,
                     "gradient_accumulation_steps": lay.num_micro, "amp": work.amp or "none",
                     "recompute": lay.recompute},
        "strategy": strategy,
    }
    header = [
        f"# written by `sampan plan`: {lay.label()}, {lay.schedule_label()}, micro-batch {lay.micro_batch} x "
        f"{lay.num_micro}, recompute {lay.recompute}",
        f"# predicted: {plan.memory.total / 1e9:.1f} GB/GPU, {plan.time.total:.2f} s/step, "
        f"{plan.tokens_per_s:,.0f} tokens/s, MFU {plan.mfu:.1%} on {lay.gpus} GPUs",
        f"# run on {lay.gpus} GPUs: sampan launch --nnodes NODES --nproc_per_node GPUS_PER_NODE --rdzv_endpoint HOST:PORT "
        "-m sampan.cli train --config THIS_FILE",
        "# [data] token_file is a placeholder: point it at your token file (sampan data build).",
        *notes,
    ]
    return "\n".join(header + [""] + _toml_tables(doc)) + "\n"


def write_run_file(path: str | Path, text: str) -> Path:
    """Atomically write ``text`` (temp file + fsync + rename)."""
    return atomic_write(path, text)


def _sim_gb(n: float | None, unit: float = GB) -> str:
    return _gb(n, unit, ",.2f")


def print_simulation(report: dict[str, Any]) -> None:
    """``sampan simulate``'s tables: per simulated rank, simulated vs planned bytes per component, what
    held the peak, the collectives; then the worst rank's verdict."""
    lay = report["layout"]
    sched = "-" if lay["pp"] == 1 else (f"interleaved v{lay['vpp']}" if lay["vpp"] > 1 else lay["schedule"])
    print(f"sampan simulate: {report['model']} ({report['parameters'] / 1e9:.1f}B) on {report['gpus']:,} ranks · "
          f"{report['label']} · {sched} · micro-batch {lay['micro_batch']} x {lay['num_micro']} · recompute "
          f"{lay['recompute']} · {report['amp'] or 'fp32'} · seq {report['seq_len']} · global batch "
          f"{report['global_batch']}")
    print(f"  {report['method']}")
    if report["model_overrides"]:
        print(f"  model changed as sampan plan --write-strategy does: {report['model_overrides']}")
    small = max(r["simulated_bytes"]["total"] for r in report["ranks"]) < GB
    unit, name = (1e6, "MB") if small else (GB, "GB")
    for row in report["ranks"]:
        c = row["coords"]
        print(f"\nrank {row['rank']} (pp {c['pp']}, dp {c['dp']}, sharding {c['sharding']}, cp {c['cp']}, mp {c['mp']}; "
              f"stages {row['stages']}): {row['num_micro_run']} micro-batches run, {row['seconds']:.0f} s")
        print(f"  {'component':<24} {'simulated ' + name:>13} {'planned ' + name:>11} {'sim/plan':>9}")
        for key, label in COMPONENTS:
            r = row["ratio"][key]
            print(f"  {label:<24} {_sim_gb(row['simulated_bytes'][key], unit):>13} {_sim_gb(row['planned_bytes'][key], unit):>11} "
                  f"{'-' if r is None else f'{r:.3f}':>9}")
        plan = row["planned_bytes"]
        print(f"  (planned activations {_sim_gb(plan['activations'], unit)} + buffers {_sim_gb(plan['buffers'], unit)} {name}; "
              f"the planner's {_sim_gb(plan['reserved'])} GB reserve is not simulated)")
        if row["peak_breakdown"]:
            print(f"  largest at the peak (op, dtype, shape: count x, {name}):")
            for group in row["peak_breakdown"][:6]:
                shape = "x".join(map(str, group["shape"])) or "scalar"
                print(f"    {group['op']:<28} {group['dtype']:<9} {shape:<22} {group['count']:>5} x  "
                      f"{_sim_gb(group['bytes'], unit):>9}")
        comm = row["collectives"]
        if comm:
            parts = [f"{kind} {v['calls']} x, {_sim_gb(v['payload_bytes'], unit)} {name} payload, "
                     f"{_sim_gb(v['wire_bytes'], unit)} {name} wire" for kind, v in comm.items()]
            print("  collectives: " + "; ".join(parts))
        for note in row["notes"]:
            print(f"  note: {note}")
    verdict = "fits" if report["fits"] else "does NOT fit"
    print(f"\nworst: rank {report['worst_rank']} needs {_sim_gb(report['worst_needs_bytes'])} GB (simulated peak + the "
          f"planner's {_sim_gb(report['reserve_bytes'])} GB reserve): {verdict} in {report['gpu_memory_bytes'] / GB:g} GB; "
          f"simulated in {report['wall_seconds']:.0f} s")

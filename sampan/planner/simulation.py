"""The plan beside the simulation: ``sampan simulate`` runs fleet's real code for one rank of a layout
on fake tensors (``sampan.distributed.simulate``); :func:`compare_with_plan` sets each simulated
rank's bytes next to what the planner's memory model predicts for its pipeline stage.

Torch-free (the simulation's results come in as plain dicts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sampan.planner.job import Job
from sampan.planner.layout import Layout, Workload
from sampan.planner.memory import stage_memory
from sampan.planner.model_shape import ModelShape

GB = 1e9
# The components compared, and how they are printed.
COMPONENTS = (("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer state"),
              ("other", "activations + buffers"), ("total", "peak (no reserve)"))


def strategy_layout(strategy: Mapping[str, Any], degrees: Mapping[str, int], global_batch: int,
                    amp: bool) -> Layout:
    """The planner's ``Layout`` of a strategy (``DistributedStrategy.to_dict()`` or a run file's
    ``[strategy]`` table) training ``global_batch`` sequences per step; its
    ``pipeline_configs.accumulate_steps`` is the step's micro-batch count per data rank."""
    accumulate = int((strategy.get("pipeline_configs") or {}).get("accumulate_steps", 1))
    data = degrees.get("dp", 1) * degrees.get("sharding", 1)
    if global_batch % (data * accumulate):
        raise ValueError(f"the global batch {global_batch} does not split into data ranks ({data}) x micro-batches "
                         f"(accumulate_steps {accumulate})")
    return Layout.from_strategy(strategy, degrees, micro_batch=global_batch // (data * accumulate),
                                num_micro=accumulate, amp=amp)


def planned_bytes(shape: ModelShape, layout: Layout, work: Workload, stage: int) -> dict[str, float]:
    """The planner's bytes for one rank of pipeline stage ``stage``, under the simulation's names."""
    mem = stage_memory(shape, layout, work, stage)
    return {"params": mem.params, "grads": mem.grads, "optimizer": mem.optimizer,
            "activations": mem.activations, "buffers": mem.buffers,
            "other": mem.activations + mem.buffers, "total": mem.total - mem.reserved, "reserved": mem.reserved}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def compare_with_plan(results: Sequence[Mapping[str, Any]], shape: ModelShape, layout: Layout,
                      work: Workload) -> list[dict[str, Any]]:
    """One row per simulated rank: its simulated and planned bytes per component, their ratios, the
    step's peak and what held it, the collectives and the simulation's notes."""
    rows = []
    for res in results:
        sim = {"params": res["params"], "grads": res["grads"], "optimizer": res["optimizer"],
               "other": res["peak_other"], "total": res["peak_total"]}
        plan = planned_bytes(shape, layout, work, res["coords"]["pp"])
        rows.append({"rank": res["rank"], "coords": res["coords"], "stages": res["stages"],
                     "num_micro_run": res["num_micro"], "seconds": res["seconds"],
                     "simulated_bytes": sim, "planned_bytes": plan,
                     "ratio": {k: _ratio(sim[k], plan[k]) for k in sim},
                     "peak_bytes": res["peak"], "peak_breakdown": res["peak_breakdown"],
                     "collectives": res["collectives"], "notes": res["notes"]})
    return rows


def verdict(rows: Sequence[Mapping[str, Any]], gpu_memory_gb: float) -> dict[str, Any]:
    """The worst simulated rank, what it needs with the planner's reserve, and whether it fits."""
    worst = max(rows, key=lambda r: r["simulated_bytes"]["total"])
    need = worst["simulated_bytes"]["total"] + worst["planned_bytes"]["reserved"]
    return {"worst_rank": worst["rank"], "worst_needs_bytes": need, "reserve_bytes": worst["planned_bytes"]["reserved"],
            "gpu_memory_bytes": gpu_memory_gb * GB, "fits": need <= gpu_memory_gb * GB}


def read_strategy(text: str) -> dict[str, Any]:
    """``--strategy``: inline JSON, or a config file whose ``[strategy]`` table (or whole body) it is."""
    from pathlib import Path

    from sampan.utils.config_files import load_config_file, parse_config_text

    if text.strip().startswith("{"):
        data = parse_config_text(text, ".json", "--strategy")
    elif Path(text).is_file():
        data = load_config_file(text)
        data = data.get("strategy", data)
    else:
        raise ValueError(f"--strategy {text!r} is neither a JSON object nor a file")
    if not isinstance(data, dict):
        raise ValueError("--strategy must be a JSON object of DistributedStrategy sections")
    return data


def simulate_job(job: Job, strategy_text: str | None, gpu_memory_gb: float, ranks: Sequence[int] = (),
                 stages: str = "ends", num_micro: int | None = None, processes: int = 2) -> dict[str, Any]:
    """``sampan simulate``: one rank per pipeline stage (``stages`` "ends" or "all", or the given
    ``ranks``) of ``job`` in its layout (``job.fix``, or a DistributedStrategy as ``strategy_text``),
    run as fleet's real code on fake tensors (``sampan.distributed.simulate``, which imports
    torch), each rank set beside the plan's bytes for its stage, and the worst one's fit in
    ``gpu_memory_gb``. Every mistake in the layout is an error before anything runs."""
    import time

    from sampan.distributed.strategy import DistributedStrategy
    from sampan.models.registry import list_models
    from sampan.planner.model_shape import load_config, shape_from_config

    if (job.fix is None) == (strategy_text is None):
        raise ValueError("give the layout with --fix dp=..,mp=..,pp=.. or --strategy JSON_OR_FILE (one of them)")
    if job.model is None or job.gpus is None:
        raise ValueError("simulate needs --model and --gpus")
    work = job.workload()
    name, config = load_config(job.model)
    registered = job.model in list_models()
    shape = shape_from_config(name, config, registered=job.model if registered else None)
    if job.fix is not None:
        strategy = job.layout().to_strategy(amp=work.amp)
    else:
        strategy = DistributedStrategy.from_dict(read_strategy(strategy_text))
        strategy.amp = work.amp
    degrees = strategy.resolve_degrees(job.gpus)
    strategy.check_precision()
    layout = strategy_layout(strategy.to_dict(), degrees, job.global_batch, work.amp is not None)
    if degrees["cp"] > 1:
        from sampan.distributed.context_parallel import check_sequence

        check_sequence(work.seq_len, degrees["cp"])
    overrides: dict[str, Any] = {}
    vocab = shape.padded_vocab(degrees["mp"])
    if vocab != config.vocab_size:  # as `sampan plan --write-strategy` pads it
        overrides["vocab_size"] = vocab
    try:
        moe = config.moe_shape() if hasattr(config, "moe_shape") else None
        strategy.validate_for_model(config.num_heads, config.num_layers, vocab, degrees,
                                    num_kv_heads=getattr(config, "num_kv_heads", None),
                                    num_experts=moe.num_experts if moe is not None else None)
    except ValueError as err:
        raise ValueError(str(err).replace(":\n  - ", ": ").replace("\n  - ", "; ")) from None
    if work.seq_len > config.max_position_embeddings:
        raise ValueError(f"--seq-len {work.seq_len} exceeds {job.model}'s max_position_embeddings "
                         f"{config.max_position_embeddings}")
    bad = [r for r in ranks if not 0 <= r < job.gpus]
    if bad:
        raise ValueError(f"--rank {bad[0]} is outside 0..{job.gpus - 1}")

    from sampan.distributed.simulate import simulate

    start = time.perf_counter()
    results = simulate(job.model if registered else config.to_dict(), strategy, job.gpus, job.global_batch,
                       work.seq_len, ranks=list(ranks) or None, stages=stages, num_micro=num_micro,
                       amp=work.amp is not None, processes=processes, model_overrides=overrides or None,
                       moe_load_factor=work.load_factor(strategy.hybrid_configs.ep_degree))
    rows = compare_with_plan(results, shape, layout, work)
    return {"model": name, "parameters": config.num_parameters(), "gpus": job.gpus,
            "layout": layout.to_dict(), "label": layout.label(), "seq_len": work.seq_len,
            "global_batch": job.global_batch, "amp": work.amp, "model_overrides": overrides, "ranks": rows,
            **verdict(rows, gpu_memory_gb), "wall_seconds": time.perf_counter() - start,
            "method": "fleet's real code on one rank at a time: torch's fake process group + FakeTensorMode "
                      "(docs/scale.md)"}


__all__ = ["COMPONENTS", "compare_with_plan", "planned_bytes", "read_strategy", "simulate_job", "strategy_layout",
           "verdict"]

"""The plan beside the simulation: ``sampan simulate`` runs fleet's real code for one rank of a layout
on fake tensors (``sampan.distributed.simulate``); :func:`compare_with_plan` sets each simulated
rank's bytes next to what the planner's memory model predicts for its pipeline stage.

Torch-free (the simulation's results come in as plain dicts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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


__all__ = ["COMPONENTS", "compare_with_plan", "planned_bytes", "strategy_layout", "verdict"]

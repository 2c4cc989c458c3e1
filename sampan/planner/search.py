"""Every valid layout for a model on a cluster, priced and ranked.

Valid means sampan can run it: dp x sharding x pp x cp x mp equals the GPUs; mp divides the heads
and the key/value heads (tensor parallel gives each rank whole KV heads under grouped-query
attention) and fits in a node (tensor parallel all-reduces every block; across nodes it never
wins); pp x vpp is at most the layers (fleet cuts them into pp x vpp chunks, earlier chunks one
longer when uneven, and the planner prices each rank's own); the micro-batch divides each data
rank's share of the global batch; a pipeline gets at least pp micro-batches (the interleaved
schedule a multiple of pp); sequence parallel only with mp > 1. Context parallel (cp up to 16,
cutting each sequence into 2 cp equal chunks) is tried only for sequences of 8K tokens and more:
below that one rank holds a whole sequence's activations easily, and cp only adds traffic. Under
bf16 the search prices AMP level O2 (bf16 parameters with fp32 master weights), which needs no
more memory than O1 (autocast over fp32 parameters) and moves half the gathered bytes at the
same compute; ``--fix amp=O1`` prices O1. ZeRO stage 1 runs as stage 2 in sampan (FSDP2), so the
search tries stages 2 and 3. The vocabulary is padded to a multiple of 128 x mp when mp does not
divide it (``--write-strategy`` writes the padded size). Full recompute is also tried with
activation offload (the blocks' inputs in host memory), priced with its copies on the compute
stream, so it ranks below the same layout without offload whenever both fit. An MoE model also
tries every expert-parallel degree ``ep`` that divides both the data ranks and the experts.
"""

from __future__ import annotations

import dataclasses
import math
import time as _time
from collections.abc import Iterator

from sampan.planner.hardware import Hardware
from sampan.planner.layout import Layout, Workload
from sampan.planner.memory import Memory, memory
from sampan.planner.model_shape import ModelShape
from sampan.planner.time import StepTime, model_flops_per_step, step_time

MAX_VPP = 8
MAX_MICRO_BATCH = 64
MAX_CP = 16
CP_FROM_SEQ_LEN = 8192
# (recompute, offload): offload only with full recompute, where the block inputs are all it keeps.
RECOMPUTE_CHOICES = (("none", False), ("selective", False), ("full", False), ("full", True))


@dataclasses.dataclass(frozen=True)
class Plan:
    """A layout with its predicted memory and step time."""

    layout: Layout
    memory: Memory
    time: StepTime
    tokens_per_s: float
    mfu: float
    fits: bool

    def to_dict(self) -> dict:
        return {"layout": self.layout.to_dict(), "memory_bytes": self.memory.to_dict(),
                "step_time_s": self.time.to_dict(), "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
                "fits": self.fits, "bottleneck": self.time.bottleneck}


def evaluate(model: ModelShape, layout: Layout, work: Workload, hw: Hardware, overlap: bool = True) -> Plan:
    """Price one layout (no validity checks beyond the layout's own)."""
    mem = memory(model, layout, work)
    st = step_time(model, layout, work, hw, overlap)
    tokens_per_s = work.tokens / st.total
    mfu = model_flops_per_step(model, work) / st.total / (layout.gpus * hw.peak_flops)
    return Plan(layout, mem, st, tokens_per_s, mfu, mem.total <= hw.memory_bytes)


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def mp_problem(model: ModelShape, mp: int) -> str | None:
    """Why tensor parallel degree ``mp`` cannot split ``model`` (None when it can): each rank needs
    whole query heads and, with grouped-query attention, whole key/value heads."""
    if model.heads % mp:
        return f"mp {mp} does not divide the {model.heads} heads"
    if model.kv_heads % mp:
        return (f"mp {mp} does not divide the {model.kv_heads} key/value heads (grouped-query attention: each "
                f"tensor-parallel rank needs whole KV heads; mp can be one of {divisors(model.kv_heads)})")
    return None


def check_inputs(model: ModelShape, gpus: int, work: Workload, hw: Hardware) -> None:
    """Refuse a cluster the search cannot lay out (GPUs not a whole number of nodes)."""
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise ValueError(f"--gpus must be an integer >= 1, got {gpus!r}")
    if gpus > hw.gpus_per_node and gpus % hw.gpus_per_node:
        raise ValueError(f"--gpus {gpus} is not a whole number of nodes of {hw.gpus_per_node} GPUs "
                         "(--gpus-per-node); use a multiple of it")
    if work.seq_len > model.max_positions and model.family != "shape":
        pass  # planning a longer context than the config's table is allowed: positions are cheap


def _pipeline_and_context(ranks: int, work: Workload) -> Iterator[tuple[int, int]]:
    """``(pp, cp)`` pairs for ``ranks`` ranks: context parallel only for long sequences (module doc)."""
    for pp in divisors(ranks):
        for cp in divisors(ranks // pp):
            if cp == 1 or (work.seq_len >= CP_FROM_SEQ_LEN and cp <= MAX_CP and work.seq_len % (2 * cp) == 0):
                yield pp, cp


def layouts(model: ModelShape, gpus: int, work: Workload, hw: Hardware) -> Iterator[Layout]:
    """All valid layouts (see the module docstring)."""
    # O2 needs no more memory than O1 and gathers half the bytes at the same compute, so under bf16
    # it is never slower: the search prices O2 only (--fix amp=O1 prices autocast over fp32).
    levels = ("O2",) if work.amp else ("O1",)
    for mp in divisors(gpus):
        if mp_problem(model, mp) or mp > hw.gpus_per_node:
            continue
        for pp, cp in _pipeline_and_context(gpus // mp, work):
            if model.layers < pp:
                continue
            data = gpus // (mp * pp * cp)
            if work.global_batch % data:
                continue
            per_rank = work.global_batch // data
            schedules = [("1F1B", 1)] if pp == 1 else [("1F1B", 1), ("GPipe", 1)] + [
                ("Interleaved1F1B", v) for v in range(2, MAX_VPP + 1) if pp * v <= model.layers]
            eps = divisors(math.gcd(data, model.moe.num_experts)) if model.moe is not None else [1]
            for sharding, ep in ((sh, ep) for sh in divisors(data) for ep in eps):
                dp = data // sharding
                stages = (1,) if sharding * cp == 1 else (2, 3)
                for mb in divisors(per_rank):
                    if mb > MAX_MICRO_BATCH:
                        break
                    num_micro = per_rank // mb
                    if pp > 1 and num_micro < pp:
                        continue
                    for schedule, vpp in schedules:
                        if vpp > 1 and num_micro % pp:
                            continue
                        for sp in ((False, True) if mp > 1 else (False,)):
                            for stage in stages:
                                for recompute, offload in RECOMPUTE_CHOICES:
                                    for level in levels:
                                        yield Layout(dp, mp, pp, sharding, stage, mb, num_micro, recompute,
                                                     schedule, vpp, sp, cp, level, offload=offload, ep=ep)


@dataclasses.dataclass
class SearchResult:
    plans: list[Plan]
    """The best ``top`` layouts that fit, fastest first."""
    considered: int
    fitting: int
    seconds: float
    best_unfitting: Plan | None = None
    """When nothing fits: the layout that needs the least memory, to say by how much."""


def search(model: ModelShape, gpus: int, work: Workload, hw: Hardware, top: int = 10,
           overlap: bool = True) -> SearchResult:
    """Rank every valid layout by predicted step time; only layouts that fit in memory are ranked."""
    check_inputs(model, gpus, work, hw)
    start = _time.perf_counter()
    considered = fitting = 0
    kept: list[Plan] = []
    smallest: tuple[float, Layout] | None = None
    for layout in layouts(model, gpus, work, hw):
        considered += 1
        mem = memory(model, layout, work)  # cheap first: most layouts fail on memory
        if mem.total > hw.memory_bytes:
            if smallest is None or mem.total < smallest[0]:
                smallest = (mem.total, layout)
            continue
        fitting += 1
        plan = evaluate(model, layout, work, hw, overlap)
        kept.append(plan)
        if len(kept) > 4 * top + 64:  # keep the list short without sorting every time
            kept.sort(key=_rank_key)
            del kept[top:]
    kept.sort(key=_rank_key)
    seconds = _time.perf_counter() - start
    if considered == 0:
        raise ValueError(_no_layout_reason(model, gpus, work, hw))
    worst = evaluate(model, smallest[1], work, hw, overlap) if (fitting == 0 and smallest) else None
    return SearchResult(kept[:top], considered, fitting, seconds, worst)


def _rank_key(plan: Plan) -> tuple:
    # Fastest first; among equals, less memory.
    return (round(plan.time.total, 9), plan.memory.total)


def _no_layout_reason(model: ModelShape, gpus: int, work: Workload, hw: Hardware) -> str:
    mps = [d for d in divisors(gpus) if mp_problem(model, d) is None and d <= hw.gpus_per_node]
    heads = (f"the {model.heads} heads" if model.kv_heads == model.heads
             else f"the {model.heads} heads and {model.kv_heads} key/value heads")
    return (f"no valid layout of {model.name} on {gpus} GPUs: the global batch {work.global_batch} must be divisible "
            f"by the data-parallel ranks gpus / (mp x pp) for some mp in {mps} (dividing {heads}) and "
            f"pp dividing the {model.layers} layers; try a global batch that is a multiple of {gpus}")


def check_fixed_layout(model: ModelShape, layout: Layout, work: Workload) -> None:
    """What sampan would refuse for one given layout (``--fix``), said before pricing it."""
    problems = []
    mp = mp_problem(model, layout.mp)
    if mp is not None:
        problems.append(mp)
    if model.layers < layout.pp * layout.vpp:
        problems.append(f"pp x vpp = {layout.pp * layout.vpp} exceeds the {model.layers} layers")
    if layout.pp > 1 and layout.num_micro < layout.pp:
        problems.append(f"{layout.num_micro} micro-batches are fewer than pp {layout.pp} stages")
    if layout.cp > 1 and work.seq_len % (2 * layout.cp):
        problems.append(f"cp {layout.cp} cuts each sequence into {2 * layout.cp} equal chunks, but seq-len "
                        f"{work.seq_len} is not a multiple of {2 * layout.cp}")
    if layout.amp_level == "O2" and not work.amp:
        problems.append("amp=O2 (bf16 parameters) needs bf16: drop --fp32")
    if layout.ep > 1 and model.moe is None:
        problems.append(f"ep {layout.ep}: {model.name} has no experts (expert parallelism needs an MoE model)")
    elif model.moe is not None and model.moe.num_experts % layout.ep:
        problems.append(f"ep {layout.ep} does not divide the {model.moe.num_experts} experts (each expert-parallel "
                        f"rank holds E / ep whole experts; ep can be one of "
                        f"{divisors(math.gcd(model.moe.num_experts, layout.data_ranks))})")
    if problems:
        raise ValueError("--fix layout is not valid: " + "; ".join(problems))

"""What ``sampan plan`` and ``sampan simulate`` are asked about, declared once for both: a model on
a cluster (``Job``), and the cluster's GPUs (``GpuChoice``). Torch-free.

``sampan plan --write-strategy`` writes the answer as a run file (``[strategy]`` beside the
``[model]``, ``[data]`` and ``[training]`` it implies), which ``sampan train`` runs and
``sampan simulate --strategy`` reads back.
"""

from __future__ import annotations

import dataclasses

from sampan.planner.hardware import PRESETS, Hardware, get_hardware
from sampan.planner.layout import DEFAULT_MOE_LOAD_FACTOR, FIX_METAVAR, Layout, Workload, parse_fix

DEFAULT_SEQ_LEN = 2048


@dataclasses.dataclass
class Job:
    """A model trained on a cluster: the question a plan or a simulation answers.

    Fields:
        model: a name from ``sampan models`` (e.g. gpt-175b, qwen2.5-7b, llama3-405b) or a config
            file: sampan's or a Hugging Face llama / qwen2 / qwen3 config.json, or a run file's
            [model] table.
        gpus: total GPUs (ranks) of the cluster.
        seq_len: tokens per sequence (default: 2048; ``sampan plan --from-run``: the run's).
        global_batch: sequences per optimizer step.
        fp32: fp32 training instead of bf16 autocast (at amp=O2, bf16 parameters).
        fix: one layout, dp=..,mp=..,pp=.. (missing dp takes the leftover GPUs; the micro-batch
            count follows from the global batch; also cp=, sharding=, stage=, micro_batch=,
            num_micro=, recompute=, schedule=, vpp=, sp=, amp=O1|O2, master_weights=,
            master_grads=, offload=, and ep= for an MoE model's expert parallelism).
        fp8: price the blocks' linear-layer GEMMs at the FP8 peak (as DeepSeek-V3 trained; sampan
            trains in bf16); attention, router, embedding and head stay bf16.
        moe_load_factor: MoE: the busiest expert-parallel rank's routed tokens over the mean (an
            assumed router imbalance, default 1.1); stretches expert compute and the all-to-all.
        moe_dispatch: MoE: "copies" (every routed copy crosses the network on its own: sampan's
            expert parallelism) or "node_dedup" (once per destination node, then NVLink: DeepSeek-V3).
        a2a_overlap: MoE: the share of the all-to-all hidden behind compute, 0 to 1 (sampan runs
            it in line: 0; DeepSeek-V3's DualPipe overlaps it: 1).
    """

    model: str | None = None
    gpus: int | None = None
    seq_len: int | None = None
    global_batch: int = 1536
    fp32: bool = False
    fix: str | None = None
    fp8: bool = False
    moe_load_factor: float = DEFAULT_MOE_LOAD_FACTOR
    moe_dispatch: str = "copies"
    a2a_overlap: float = 0.0

    def __post_init__(self) -> None:
        for name in ("gpus", "seq_len", "global_batch"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1, got {value!r}")

    def workload(self) -> Workload:
        """The step it trains: ``seq_len`` (default 2048) x ``global_batch`` tokens, bf16 or fp32."""
        return Workload(self.seq_len or DEFAULT_SEQ_LEN, self.global_batch, None if self.fp32 else "bf16",
                        fp8=self.fp8, moe_load_factor=self.moe_load_factor, moe_dispatch=self.moe_dispatch,
                        a2a_overlap=self.a2a_overlap)

    def layout(self) -> Layout:
        """``fix`` as a layout of ``gpus``."""
        if self.fix is None or self.gpus is None:
            raise ValueError("a layout needs --fix dp=..,mp=..,pp=.. and --gpus")
        return parse_fix(self.fix, self.gpus, self.workload())


@dataclasses.dataclass
class GpuChoice:
    """The cluster's GPUs: a preset, and/or numbers that override it.

    Fields:
        hardware: preset: a100-80g (default), h100-80g, h200 or h800-80g.
        gpus_per_node: GPUs per node (preset: 8).
        gpu_memory_gb: memory per GPU in GB (preset: 80 for A100 / H100 / H800, 141 for H200).
        gpu_tflops: peak dense bf16 TFLOP/s per GPU.
        intra_node_gbps: NVLink GB/s per GPU, both directions summed (A100 600, H100 900, H800 400).
        inter_node_gbps: network Gb/s per GPU, one direction (HDR 200, NDR 400).
        matmul_efficiency: share of peak the matmuls reach (calibrated default: docs/planner.md).
    """

    hardware: str | None = None
    gpus_per_node: int | None = None
    gpu_memory_gb: float | None = None
    gpu_tflops: float | None = None
    intra_node_gbps: float | None = None
    inter_node_gbps: float | None = None
    matmul_efficiency: float | None = None

    def __post_init__(self) -> None:
        if self.hardware is not None and self.hardware not in PRESETS:
            raise ValueError(f"unknown hardware preset {self.hardware!r}; known: {', '.join(sorted(PRESETS))}")

    def overrides(self) -> dict[str, float | int | None]:
        """The explicit numbers, under ``Hardware``'s field names."""
        return {"gpus_per_node": self.gpus_per_node, "memory_gb": self.gpu_memory_gb, "tflops": self.gpu_tflops,
                "intra_node_gbps": self.intra_node_gbps, "inter_node_gbps": self.inter_node_gbps,
                "matmul_efficiency": self.matmul_efficiency}

    def resolve(self) -> Hardware:
        """The preset with the explicit numbers applied."""
        return get_hardware(self.hardware, **self.overrides())


def plan_job(model, job: Job, hw: Hardware, top: int = 10):
    """``sampan plan``'s answer: the priced ``--fix`` layout, or the ``top`` layouts the search
    finds, as ``(plans, search result or None)``. A job that fits in no layout is an error naming
    the leanest layout and what it needs."""
    from sampan.planner.search import check_fixed_layout, check_inputs, evaluate, search

    if job.gpus is None:
        raise ValueError("--gpus is required (total GPUs of the cluster to plan for), e.g. --gpus 1024")
    work = job.workload()
    if job.fix is not None:
        check_inputs(model, job.gpus, work, hw)
        layout = job.layout()
        check_fixed_layout(model, layout, work)
        return [evaluate(model, layout, work, hw)], None
    result = search(model, job.gpus, work, hw, top=top)
    if not result.plans:
        need = result.best_unfitting
        msg = f"no layout of {model.name} fits in {hw.memory_gb:g} GB per GPU on {job.gpus} GPUs"
        if need is not None:
            msg += (f"; the leanest ({need.layout.label()}, recompute {need.layout.recompute}, micro-batch "
                    f"{need.layout.micro_batch}) needs {need.memory.total / 1e9:.1f} GB: add GPUs or memory")
        raise ValueError(msg)
    return result.plans, result


__all__ = ["DEFAULT_SEQ_LEN", "FIX_METAVAR", "GpuChoice", "Job", "plan_job"]

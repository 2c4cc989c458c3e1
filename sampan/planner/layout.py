"""One candidate layout: the degrees, the micro-batching, recompute and the pipeline schedule."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # sampan.distributed imports torch; the planner must not (see to_strategy)
    from sampan.distributed.strategy import DistributedStrategy

# The values sampan.distributed.strategy accepts, repeated here so planning never imports torch
# (tests/test_planner_cold_start.py checks they stay equal).
SCHEDULE_MODES = ("1F1B", "Interleaved1F1B", "GPipe")
RECOMPUTE_MODES = ("none", "full", "selective")
AMP_LEVELS = ("O1", "O2")
SCHEDULE_NAMES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "interleaved1f1b": "Interleaved1F1B",
                  "gpipe": "GPipe", "fthenb": "GPipe"}


DEFAULT_MOE_LOAD_FACTOR = 1.1
"""Assumed router imbalance: the busiest expert-parallel rank's routed tokens over the mean (an
assumption, not measured: aux-loss-free balancing as DeepSeek-V3 reports keeps loads close to even,
and 1.1 leaves 10% for what remains). It stretches expert compute and the all-to-all."""


MOE_DISPATCH = ("copies", "node_dedup")


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one optimizer step trains: ``global_batch`` sequences of ``seq_len`` tokens."""

    seq_len: int = 2048
    global_batch: int = 1536
    amp: str | None = "bf16"
    """"bf16" (autocast over fp32 parameters, as sampan's AMP does) or None (fp32)."""
    fp8: bool = False
    """The blocks' linear layers (attention projections, MLPs, experts) run their GEMMs in FP8, as
    DeepSeek-V3 trained (``Hardware.fp8_tflops``); attention itself, router, embedding and head stay
    bf16. Sampan does not train in FP8: this prices a published run that did."""
    moe_load_factor: float = DEFAULT_MOE_LOAD_FACTOR
    """MoE only: routed tokens on the busiest expert-parallel rank over the mean (>= 1)."""
    moe_dispatch: str = "copies"
    """MoE only: what the all-to-all sends across nodes. "copies": every routed copy of a token on
    its own (sampan's expert parallelism); "node_dedup": a token crosses the network once per
    destination node and fans out over NVLink there (DeepSeek-V3's dispatch kernels)."""
    a2a_overlap: float = 0.0
    """MoE only: the share of the all-to-all hidden behind compute (sampan: 0, it runs in line;
    DeepSeek-V3's DualPipe overlaps a forward and a backward micro-batch's: up to 1). What is hidden
    never exceeds the compute it hides behind."""

    def __post_init__(self) -> None:
        for name in ("seq_len", "global_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be an integer >= 1, got {value!r}")
        if self.amp not in (None, "bf16"):
            raise ValueError(f"amp must be 'bf16' or None, got {self.amp!r}")
        if self.fp8 and self.amp is None:
            raise ValueError("fp8 GEMMs need bf16 training around them: drop --fp32 or --fp8")
        if self.moe_dispatch not in MOE_DISPATCH:
            raise ValueError(f"moe dispatch must be one of {list(MOE_DISPATCH)}, got {self.moe_dispatch!r}")
        if isinstance(self.a2a_overlap, bool) or not isinstance(self.a2a_overlap, (int, float)) or not (
                0 <= self.a2a_overlap <= 1):
            raise ValueError(f"a2a overlap (share of the all-to-all hidden behind compute) must be in [0, 1], got "
                             f"{self.a2a_overlap!r}")
        factor = self.moe_load_factor
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor < 1:
            raise ValueError(f"moe load factor (busiest rank's routed tokens over the mean) must be a number >= 1, "
                             f"got {factor!r}")

    @property
    def tokens(self) -> int:
        return self.seq_len * self.global_batch

    def load_factor(self, ep: int) -> float:
        """The routed-token stretch of the busiest rank at expert-parallel degree ``ep``: without
        expert parallelism every rank runs every expert on its own tokens, so imbalance moves nothing."""
        return self.moe_load_factor if ep > 1 else 1.0


@dataclasses.dataclass(frozen=True)
class Layout:
    """dp x sharding x pp x cp x mp ranks; ``num_micro`` micro-batches of ``micro_batch`` sequences per
    data-parallel rank and step.

    ``cp``: context-parallel ranks, each holding ``1 / cp`` of every sequence (they also share the
    sharded model state). ``ep``: expert-parallel ranks, carved out of the data ranks (dp x
    sharding, innermost first, as ``hybrid_configs["ep_degree"]``): each group of ``ep`` data ranks
    holds every routed expert once (``E / ep`` each); expert state is data-parallel over the other
    ``dp x sharding / ep`` ranks and ZeRO-sharded over the part of them that is sharding.
    ``amp_level``: "O1" (autocast over fp32 parameters) or "O2" (bf16
    parameters through FSDP2 mixed precision); ``master_weights`` / ``master_grads``: O2's fp32
    master weights and optimizer state / fp32 gradient reduction (``DistributedStrategy.amp_configs``).
    """

    dp: int = 1
    mp: int = 1
    pp: int = 1
    sharding: int = 1
    stage: int = 1
    micro_batch: int = 1
    num_micro: int = 1
    recompute: str = "none"
    schedule: str = "1F1B"
    vpp: int = 1
    sp: bool = False
    cp: int = 1
    amp_level: str = "O1"
    master_weights: bool = True
    master_grads: bool = True
    offload: bool = False
    ep: int = 1

    def __post_init__(self) -> None:
        if self.amp_level not in AMP_LEVELS:
            raise ValueError(f"amp level must be one of {list(AMP_LEVELS)}, got {self.amp_level!r}")
        for name in ("dp", "mp", "pp", "sharding", "micro_batch", "num_micro", "vpp", "cp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"layout {name} must be an integer >= 1, got {value!r}")
        if self.data_ranks % self.ep:
            raise ValueError(f"layout ep {self.ep} must divide the data ranks dp x sharding = {self.data_ranks}: "
                             "expert-parallel ranks are carved out of them")
        if self.stage not in (1, 2, 3):
            raise ValueError(f"layout sharding stage must be 1, 2 or 3, got {self.stage!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute must be one of {list(RECOMPUTE_MODES)}, got {self.recompute!r}")
        if self.offload and self.recompute == "none":
            raise ValueError("offload keeps the inputs of recomputed blocks in host memory, so it needs recompute: "
                             "add recompute=full (or selective), or drop offload")
        if self.schedule not in SCHEDULE_MODES:
            raise ValueError(f"schedule must be one of {list(SCHEDULE_MODES)} (or 1f1b / interleaved / gpipe), "
                             f"got {self.schedule!r}")
        if (self.schedule == "Interleaved1F1B") != (self.vpp >= 2):
            raise ValueError(f"schedule {self.schedule} with vpp={self.vpp}: the interleaved schedule needs vpp >= 2, "
                             "the others vpp = 1")

    @property
    def gpus(self) -> int:
        return self.dp * self.sharding * self.pp * self.cp * self.mp

    @property
    def data_ranks(self) -> int:
        return self.dp * self.sharding

    @property
    def shard_ranks(self) -> int:
        """The ranks FSDP2 splits the model state over: sharding x cp."""
        return self.sharding * self.cp

    @property
    def expert_shard_ranks(self) -> int:
        """The ranks FSDP2 splits the routed experts' state over: of the ``dp x sharding / ep`` ranks
        that hold the same experts, those that are sharding ranks (ep takes sharding ranks first), x cp."""
        return self.sharding // math.gcd(self.sharding, self.ep) * self.cp

    @property
    def expert_data_ranks(self) -> int:
        """Ranks that hold the same experts and average their gradients: ``dp x sharding / ep``."""
        return self.data_ranks // self.ep

    @property
    def fsdp(self) -> bool:
        """Whether FSDP2 wraps the model: more than one rank averages gradients, or O2's precision."""
        return self.dp * self.shard_ranks > 1 or self.amp_level == "O2"

    def label(self) -> str:
        parts = [f"dp{self.dp}", f"sh{self.sharding}" + (f"/z{self.stage}" if self.sharding > 1 else ""),
                 f"pp{self.pp}", *([f"cp{self.cp}"] if self.cp > 1 else []), f"mp{self.mp}" + ("+sp" if self.sp else ""),
                 *([f"ep{self.ep}"] if self.ep > 1 else [])]
        if self.amp_level == "O2":
            parts.append("O2" + ("" if self.master_weights else " no-master-weights")
                         + ("" if self.master_grads else " bf16-grads"))
        if self.offload:
            parts.append("offload")
        return " ".join(parts)

    def schedule_label(self) -> str:
        if self.pp == 1:
            return "-"
        return f"interleaved v{self.vpp}" if self.vpp > 1 else self.schedule

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_strategy(cls, strategy: Mapping[str, Any], degrees: Mapping[str, int], micro_batch: int,
                      num_micro: int, recompute: str | None = None, amp: bool = True) -> Layout:
        """The layout a strategy runs, read from its plain-dict form (``DistributedStrategy.to_dict()``
        or a run file's ``[strategy]`` table), so planning never imports torch.

        ``degrees``: as ``DistributedStrategy.resolve_degrees`` gives them. ``recompute``: overrides
        the strategy's (the Trainer's own argument). ``amp`` False prices the AMP level as O1 (fp32).
        Without a pipeline the schedule is 1F1B; Paddle's schedule names are accepted.
        """
        sharding = strategy.get("sharding_configs") or {}
        pipe = strategy.get("pipeline_configs") or {}
        tp = strategy.get("tensor_parallel_configs") or {}
        precision = strategy.get("amp_configs") or {}
        pp = int(degrees.get("pp", 1))
        vpp = int(pipe.get("virtual_pp_degree", 1)) if pp > 1 else 1
        schedule = str(pipe.get("schedule_mode", "1F1B")) if pp > 1 else "1F1B"
        schedule = SCHEDULE_NAMES.get(schedule.lower(), schedule)
        if vpp < 2 and schedule == "Interleaved1F1B":
            schedule = "1F1B"
        recompute = str(recompute or strategy.get("recompute") or "none")
        offload = bool((strategy.get("recompute_configs") or {}).get("enable_offload", False))
        ep = int(degrees.get("ep", (strategy.get("hybrid_configs") or {}).get("ep_degree", 1)))
        return cls(dp=int(degrees.get("dp", 1)), mp=int(degrees.get("mp", 1)), pp=pp,
                   sharding=int(degrees.get("sharding", 1)), stage=int(sharding.get("stage", 1)),
                   micro_batch=micro_batch, num_micro=num_micro, recompute=recompute, schedule=schedule, vpp=vpp,
                   sp=bool(tp.get("sequence_parallel", False)), cp=int(degrees.get("cp", 1)),
                   amp_level=str(precision.get("level", "O1")) if amp else "O1",
                   master_weights=bool(precision.get("use_master_weight", True)),
                   master_grads=bool(precision.get("use_master_grad", True)),
                   offload=offload and recompute != "none", ep=ep)

    def to_strategy(self, amp: str | None = "bf16") -> DistributedStrategy:
        """The ``DistributedStrategy`` that runs this layout in sampan."""
        from sampan.distributed.strategy import DistributedStrategy

        if self.amp_level == "O2" and amp != "bf16":
            raise ValueError("amp level O2 needs bf16 (drop --fp32, or amp=O1)")
        hybrid = {"dp_degree": self.dp, "mp_degree": self.mp, "pp_degree": self.pp,
                  "sharding_degree": self.sharding, "cp_degree": self.cp}
        if self.ep > 1:  # only then: a dense layout's strategy stays what it was
            hybrid["ep_degree"] = self.ep
        return DistributedStrategy(
            hybrid_configs=hybrid,
            sharding_configs={"stage": self.stage},
            pipeline_configs={"accumulate_steps": self.num_micro, "micro_batch_size": self.micro_batch,
                              "schedule_mode": self.schedule, "virtual_pp_degree": self.vpp},
            tensor_parallel_configs={"sequence_parallel": self.sp},
            amp_configs={"level": self.amp_level, "use_master_weight": self.master_weights,
                         "use_master_grad": self.master_grads},
            recompute_configs={"enable_offload": self.offload},
            recompute=self.recompute, amp=amp)


# How ``--fix`` looks in ``--help`` (``sampan plan`` and ``sampan simulate`` both take it).
FIX_METAVAR = ("dp=..,mp=..,pp=..,cp=..,sharding=..,ep=..,micro_batch=..,recompute=..,schedule=..,vpp=..,amp=O2,"
               "offload=true")


def parse_fix(text: str, gpus: int, workload: Workload) -> Layout:
    """``--fix dp=1,mp=8,pp=8,sharding=1,micro_batch=1,recompute=full,schedule=interleaved,vpp=2``.

    Missing degrees: ``dp`` takes the GPUs the others leave; ``num_micro`` follows from the global
    batch; ``stage`` defaults to 1, ``schedule`` to 1F1B (interleaved when vpp >= 2). Also ``cp``
    (context parallel), ``sp`` (sequence parallel), ``amp=O1|O2`` and, at O2, ``master_weights`` /
    ``master_grads`` (true / false), ``offload`` (true / false: recomputed blocks' inputs in host
    memory), ``ep`` (expert parallel, carved out of dp x sharding: it must divide them).
    """
    ints = ("dp", "mp", "pp", "sharding", "stage", "micro_batch", "num_micro", "vpp", "cp", "ep")
    bools = ("sp", "master_weights", "master_grads", "offload")
    allowed = (*ints, "recompute", "schedule", "amp", *bools)
    given: dict = {}
    from sampan.utils.settings import coerce, parse_bool, split_assignment

    for part in filter(None, (p.strip() for p in text.split(","))):
        key, value = split_assignment(part, "--fix part", "mp=8")
        key = key.replace("-", "_")
        if key not in allowed:
            raise ValueError(f"--fix part {part!r} must be KEY=VALUE with KEY one of {list(allowed)}")
        if key in ints:
            given[key] = coerce(value, 0, f"--fix {key}")
        elif key in bools:
            given[key] = parse_bool(value, f"--fix {key}")
        elif key == "schedule":
            given[key] = SCHEDULE_NAMES.get(value.lower(), value)
        elif key == "amp":
            given["amp_level"] = value.upper()
        else:
            given[key] = value
    if given.get("vpp", 1) >= 2:
        given.setdefault("schedule", "Interleaved1F1B")
    others = given.get("mp", 1) * given.get("pp", 1) * given.get("sharding", 1) * given.get("cp", 1)
    if "dp" not in given:
        if gpus % others:
            raise ValueError(f"--fix: mp x pp x sharding x cp = {others} does not divide --gpus {gpus}")
        given["dp"] = gpus // others
    if given["dp"] * others != gpus:
        raise ValueError(f"--fix: dp x mp x pp x sharding x cp = {given['dp'] * others}, but --gpus is {gpus}")
    data_ranks = given["dp"] * given.get("sharding", 1)
    mb = given.get("micro_batch", 1)
    if "num_micro" not in given:
        if workload.global_batch % (data_ranks * mb):
            raise ValueError(f"--fix: the global batch {workload.global_batch} does not split into data ranks "
                             f"({data_ranks}) x micro_batch ({mb})")
        given["num_micro"] = workload.global_batch // (data_ranks * mb)
    elif given["num_micro"] * data_ranks * mb != workload.global_batch:
        raise ValueError(f"--fix: num_micro x micro_batch x data ranks = {given['num_micro'] * data_ranks * mb}, "
                         f"but the global batch is {workload.global_batch}")
    return Layout(**given)

"""How training is split across ranks: Paddle fleet's ``DistributedStrategy`` over typed dataclasses.

    strategy = DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": -1, "mp_degree": 2, "pp_degree": 2}
    strategy.pipeline_configs = {"accumulate_steps": 8}
    degrees = strategy.resolve_degrees(world_size=8)   # {"dp": 2, "sharding": 1, "pp": 2, "cp": 1, "mp": 2}
    strategy.validate_for_model(num_heads=8, num_layers=12, vocab_size=50304, degrees=degrees)

Each section is a frozen dataclass checked in ``__post_init__``. Assigning a dict to a section updates
only the keys given (as Paddle does) and re-validates the whole section, so no field can be changed
past its checks. A strategy is plain data: building one starts nothing, and a bad layout fails here,
before any process is spawned.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

SCHEDULE_MODES = ("1F1B", "Interleaved1F1B", "GPipe")
SCHEDULE_ALIASES = {"FThenB": "GPipe"}  # Paddle's name for all-forwards-then-all-backwards
RECOMPUTE_MODES = ("none", "full", "selective")
AMP_DTYPES = (None, "bf16", "fp16")
AMP_LEVELS = ("O1", "O2")
AXES = ("dp", "sharding", "pp", "cp", "mp")  # the keys of resolve_degrees

S = TypeVar("S", bound="_Section")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int to Python, not to us


def _check_int(section: Any, name: str, minimum: int, also: tuple[int, ...] = ()) -> None:
    value = getattr(section, name)
    if not _is_int(value) or (value < minimum and value not in also):
        allowed = f"an integer >= {minimum}" + "".join(f" or {a}" for a in also)
        raise ValueError(f"{type(section).__name__}.{name} must be {allowed}, got {value!r}")


class _Section:
    """Paddle-style reading of a section: ``cfg["dp_degree"]``, ``dict(cfg)``, ``cfg.to_dict()``."""

    _attr = ""  # the DistributedStrategy attribute holding this section, for error messages

    def keys(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(f"strategy.{self._attr} has no key {key!r}; allowed: {self.keys()}")
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        # Paddle hands out a copy here, so such an assignment is silently lost; refuse it instead.
        raise TypeError(f"sections are read-only; assign a dict instead: strategy.{self._attr} = {{{key!r}: {value!r}}}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def _updated(self: S, value: Any) -> S:
        """A new section from a whole section, or from a dict of some keys (the others kept)."""
        if isinstance(value, type(self)):
            return value
        if not isinstance(value, Mapping):
            raise TypeError(f"strategy.{self._attr} takes a dict or a {type(self).__name__}, got {type(value).__name__}")
        unknown = sorted(set(value) - set(self.keys()), key=str)
        if unknown:
            raise ValueError(f"unknown key(s) {unknown} in strategy.{self._attr}; allowed: {self.keys()}")
        return dataclasses.replace(self, **value)  # type: ignore[type-var]  # runs __post_init__ again


@dataclasses.dataclass(frozen=True)
class HybridConfig(_Section):
    """How the ranks split into parallel axes; the degrees multiply to the world size."""

    _attr = "hybrid_configs"
    dp_degree: int = 1
    """Data-parallel replicas, each seeing different batches; -1 takes the ranks the others leave."""
    mp_degree: int = 1
    """Tensor (model) parallel ranks: each layer's weights are split across them."""
    pp_degree: int = 1
    """Pipeline stages: the layers are cut into this many consecutive groups."""
    sharding_degree: int = 1
    """Ranks that split one copy of the optimizer state (and more, by ShardingConfig.stage)."""
    cp_degree: int = 1
    """Context parallel ranks: each holds 1/cp of every sequence's tokens (attention gathers the
    keys and values of the others), for sequences too long for one rank's activations. They also
    share the sharded model state, as sharding ranks do."""
    ep_degree: int = 1
    """Expert parallel ranks of a Mixture-of-Experts model (Paddle's name), carved out of the data
    ranks (dp x sharding, which it must divide): each group of ep neighbouring data ranks holds
    every expert once, E / ep on each rank, and sends each token to the rank of its experts
    (all-to-all); expert weights are data parallel (and ZeRO-sharded) over the other
    dp x sharding / ep ranks. It adds no ranks, so it takes no -1."""

    def __post_init__(self) -> None:
        for name in self.keys():
            _check_int(self, name, 1, also=() if name == "ep_degree" else (-1,))
        leftover = [name for name in self.keys() if getattr(self, name) == -1]
        if len(leftover) > 1:  # two unknowns cannot be solved from one world size
            raise ValueError(f"HybridConfig: at most one degree may be -1 (the leftover ranks), got -1 for {leftover}")


@dataclasses.dataclass(frozen=True)
class ShardingConfig(_Section):
    """ZeRO sharding over the ``sharding_degree`` ranks."""

    _attr = "sharding_configs"
    stage: int = 1
    """ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters."""

    def __post_init__(self) -> None:
        if not _is_int(self.stage) or self.stage not in (1, 2, 3):
            raise ValueError("ShardingConfig.stage must be one of [1, 2, 3] (1: optimizer state, 2: + gradients, "
                             f"3: + parameters), got {self.stage!r}")


@dataclasses.dataclass(frozen=True)
class PipelineConfig(_Section):
    """Micro-batching and the schedule that runs the ``pp_degree`` stages."""

    _attr = "pipeline_configs"
    accumulate_steps: int = 1
    """Micro-batches per optimizer step (Paddle's name); a pipeline needs at least pp_degree of them."""
    micro_batch_size: int = 1
    """Samples in one micro-batch."""
    schedule_mode: str = "1F1B"
    """"1F1B", "Interleaved1F1B" or "GPipe" (Paddle's "FThenB" is accepted and stored as "GPipe")."""
    virtual_pp_degree: int = 1
    """Model chunks per pipeline rank; >= 2 exactly when schedule_mode is "Interleaved1F1B"."""

    def __post_init__(self) -> None:
        for name in ("accumulate_steps", "micro_batch_size", "virtual_pp_degree"):
            _check_int(self, name, 1)
        mode = self.schedule_mode
        mode = SCHEDULE_ALIASES.get(mode, mode) if isinstance(mode, str) else mode
        if mode not in SCHEDULE_MODES:
            raise ValueError(f"PipelineConfig.schedule_mode must be one of {list(SCHEDULE_MODES)} "
                             f"(or 'FThenB', Paddle's name for 'GPipe'), got {self.schedule_mode!r}")
        object.__setattr__(self, "schedule_mode", mode)  # frozen: normalise the alias once, here
        vpp = self.virtual_pp_degree
        # Only the interleaved schedule runs several chunks per rank, and it is pointless with one.
        if mode == "Interleaved1F1B" and vpp < 2:
            raise ValueError("PipelineConfig: schedule_mode 'Interleaved1F1B' needs virtual_pp_degree >= 2 "
                             f"(model chunks per rank), got {vpp}")
        if mode != "Interleaved1F1B" and vpp >= 2:
            raise ValueError(f"PipelineConfig: virtual_pp_degree={vpp} needs schedule_mode 'Interleaved1F1B' "
                             f"(the only schedule with several chunks per rank), got {mode!r}")


@dataclasses.dataclass(frozen=True)
class TensorParallelConfig(_Section):
    """Options of tensor (model) parallelism over the ``mp_degree`` ranks."""

    _attr = "tensor_parallel_configs"
    sequence_parallel: bool = False
    """Also split norm/dropout activations along the sequence across mp ranks; a no-op at mp_degree 1."""

    def __post_init__(self) -> None:
        if not isinstance(self.sequence_parallel, bool):
            raise ValueError(f"TensorParallelConfig.sequence_parallel must be True or False, got {self.sequence_parallel!r}")


@dataclasses.dataclass(frozen=True)
class AmpConfig(_Section):
    """How mixed precision (``strategy.amp = "bf16"``) holds the parameters (Paddle's AMP levels)."""

    _attr = "amp_configs"
    level: str = "O1"
    """"O1": autocast over fp32 parameters (the matmuls run in bf16, each casting its weight).
    "O2": the parameters themselves are bf16 where the model computes (FSDP2 mixed precision):
    all-gathers and the gathered parameters are bf16, and activations flow in bf16."""
    use_master_weight: bool = True
    """O2: keep the sharded parameters the optimizer updates, and its state, in fp32 (Paddle's master
    weights); False holds parameters and optimizer state in bf16 too (half the model state,
    updates rounded to bf16)."""
    use_master_grad: bool = True
    """O2: accumulate micro-batch gradients and reduce them across ranks in fp32; False reduces in
    bf16 (half the gradient traffic)."""

    def __post_init__(self) -> None:
        if self.level not in AMP_LEVELS:
            raise ValueError(f"AmpConfig.level must be one of {list(AMP_LEVELS)} (O1: autocast over fp32 "
                             f"parameters; O2: bf16 parameters with fp32 master weights), got {self.level!r}")
        for name in ("use_master_weight", "use_master_grad"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"AmpConfig.{name} must be True or False, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class RecomputeConfig(_Section):
    """Options of activation recompute (``strategy.recompute``), under Paddle's names."""

    _attr = "recompute_configs"
    enable_offload: bool = False
    """Keep what each recomputed block saves of its input in host memory from its forward to its
    backward (Paddle's recompute offload): the device holds no block inputs for the micro-batches
    in flight, for one device-to-host and one host-to-device copy of each per step. Needs
    ``strategy.recompute`` "full" or "selective"."""

    def __post_init__(self) -> None:
        if not isinstance(self.enable_offload, bool):
            raise ValueError(f"RecomputeConfig.enable_offload must be True or False, got {self.enable_offload!r}")


_SECTIONS: dict[str, type[_Section]] = {
    "hybrid_configs": HybridConfig, "sharding_configs": ShardingConfig,
    "pipeline_configs": PipelineConfig, "tensor_parallel_configs": TensorParallelConfig,
    "amp_configs": AmpConfig, "recompute_configs": RecomputeConfig,
}


def _section(attr: str) -> property:
    """A section property: reads give the dataclass; a dict assigned merges into it, as in Paddle."""

    def get(self: DistributedStrategy) -> Any:
        return self._sections[attr]

    def set(self: DistributedStrategy, value: Any) -> None:
        self._sections[attr] = self._sections[attr]._updated(value)

    return property(get, set, doc=_SECTIONS[attr].__doc__)


class DistributedStrategy:
    """The hybrid-parallel layout of a run (Paddle's ``fleet.DistributedStrategy``), validated as it is set.

    ``hybrid_configs``, ``sharding_configs``, ``pipeline_configs``, ``tensor_parallel_configs``,
    ``amp_configs`` and ``recompute_configs`` read as dataclasses (also ``cfg["key"]`` and
    ``dict(cfg)``) and take a whole dataclass or a dict of some keys. ``recompute`` and ``amp`` also
    take Paddle's booleans. Keyword arguments set the same attributes:
    ``DistributedStrategy(hybrid_configs={"mp_degree": 2}, amp="bf16")``.
    """

    hybrid_configs = _section("hybrid_configs")
    sharding_configs = _section("sharding_configs")
    pipeline_configs = _section("pipeline_configs")
    tensor_parallel_configs = _section("tensor_parallel_configs")
    amp_configs = _section("amp_configs")
    recompute_configs = _section("recompute_configs")

    def __init__(self, *, hybrid_configs: Mapping[str, Any] | HybridConfig | None = None,
                 sharding_configs: Mapping[str, Any] | ShardingConfig | None = None,
                 pipeline_configs: Mapping[str, Any] | PipelineConfig | None = None,
                 tensor_parallel_configs: Mapping[str, Any] | TensorParallelConfig | None = None,
                 amp_configs: Mapping[str, Any] | AmpConfig | None = None,
                 recompute_configs: Mapping[str, Any] | RecomputeConfig | None = None,
                 recompute: str | bool = "none", amp: str | bool | None = None) -> None:
        self._sections: dict[str, Any] = {attr: cls() for attr, cls in _SECTIONS.items()}
        given = {"hybrid_configs": hybrid_configs, "sharding_configs": sharding_configs,
                 "pipeline_configs": pipeline_configs, "tensor_parallel_configs": tensor_parallel_configs,
                 "amp_configs": amp_configs, "recompute_configs": recompute_configs}
        for attr, value in given.items():
            if value is not None:
                setattr(self, attr, value)
        self.recompute = recompute
        self.amp = amp

    @property
    def recompute(self) -> str:
        """Activation recomputation: "none", "full" or "selective" (True means "full", False "none")."""
        return self._recompute

    @recompute.setter
    def recompute(self, value: str | bool) -> None:
        if isinstance(value, bool):
            value = "full" if value else "none"
        if value not in RECOMPUTE_MODES:
            raise ValueError(f"strategy.recompute must be one of {list(RECOMPUTE_MODES)} or a bool, got {value!r}")
        self._recompute = value

    @property
    def amp(self) -> str | None:
        """Mixed precision: None, "bf16" or "fp16" (False means None, True "bf16")."""
        return self._amp

    @amp.setter
    def amp(self, value: str | bool | None) -> None:
        if isinstance(value, bool):  # bf16 for True: it needs no loss scaling, so it is the safe choice
            value = "bf16" if value else None
        if value not in AMP_DTYPES:
            raise ValueError(f"strategy.amp must be one of {list(AMP_DTYPES)} or a bool, got {value!r}")
        self._amp = value

    @property
    def sharding(self) -> bool:
        """Whether ZeRO sharding is on, derived from ``hybrid_configs["sharding_degree"] != 1``."""
        return self.hybrid_configs.sharding_degree != 1

    @sharding.setter
    def sharding(self, value: bool) -> None:
        # One source of truth: a separate flag could disagree with the degree, so only agreeing is allowed.
        if value is not self.sharding:
            want = ">= 2 (or -1)" if value is True else "1"
            raise ValueError(f"strategy.sharding follows hybrid_configs['sharding_degree'] (now "
                             f"{self.hybrid_configs.sharding_degree}); set strategy.hybrid_configs = "
                             f"{{'sharding_degree': N}} with N {want} instead")

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dicts for a ``[strategy]`` table; ``amp`` is left out when None (TOML has no null)."""
        out: dict[str, Any] = {attr: section.to_dict() for attr, section in self._sections.items()}
        out["recompute"] = self.recompute
        if self.amp is not None:
            out["amp"] = self.amp
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DistributedStrategy:
        """Inverse of :meth:`to_dict`; missing keys keep their defaults, unknown keys are errors naming them."""
        allowed = [*_SECTIONS, "recompute", "amp"]
        unknown = sorted(set(data) - set(allowed), key=str)
        if unknown:
            raise ValueError(f"unknown strategy key(s) {unknown}; allowed: {allowed}")
        return cls(**data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DistributedStrategy):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        sections = "".join(f"\n    {attr}={section!r}," for attr, section in self._sections.items())
        return f"DistributedStrategy({sections}\n    recompute={self.recompute!r}, amp={self.amp!r},\n)"

    def check_precision(self) -> None:
        """A clear error when ``amp_configs`` and ``amp`` disagree (they are set apart, so checked at use)."""
        if self.amp_configs.level == "O2" and self.amp != "bf16":
            raise ValueError(f"amp_configs level 'O2' (bf16 parameters) needs strategy.amp = 'bf16', got amp={self.amp!r}; "
                             "set strategy.amp = 'bf16', or amp_configs = {'level': 'O1'}")

    def check_recompute(self) -> None:
        """A clear error when offload is on without recompute (set apart, so checked at use)."""
        if self.recompute_configs.enable_offload and self.recompute == "none":
            raise ValueError("recompute_configs enable_offload moves the inputs recomputed blocks keep to host memory, "
                             "so it needs recompute: set strategy.recompute = 'full' (or 'selective'), or "
                             "recompute_configs = {'enable_offload': False}")

    @property
    def pure_bf16(self) -> bool:
        """Whether the parameters compute in bf16 (``amp_configs`` level "O2" with ``amp="bf16"``)."""
        self.check_precision()
        return self.amp_configs.level == "O2"

    def resolve_degrees(self, world_size: int) -> dict[str, int]:
        """The degrees ``{"dp", "sharding", "pp", "cp", "mp"}`` for ``world_size`` ranks, a -1 filled in."""
        if not _is_int(world_size) or world_size < 1:
            raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
        h = self.hybrid_configs
        degrees = {"dp": h.dp_degree, "sharding": h.sharding_degree, "pp": h.pp_degree, "cp": h.cp_degree,
                   "mp": h.mp_degree}
        leftover = [axis for axis, d in degrees.items() if d == -1]
        if leftover:
            others = {axis: d for axis, d in degrees.items() if d != -1}
            product = math.prod(others.values())
            if world_size % product:
                shown = " x ".join(f"{axis}_degree={d}" for axis, d in others.items())
                raise ValueError(f"cannot fill {leftover[0]}_degree=-1: the other degrees {shown} = {product} do not "
                                 f"divide world_size {world_size}; choose degrees whose product divides {world_size}")
            degrees[leftover[0]] = world_size // product
        product = math.prod(degrees.values())
        if product != world_size:
            shown = " x ".join(f"{axis}_degree={d}" for axis, d in degrees.items())
            raise ValueError(f"the parallel degrees {shown} = {product}, but world_size is {world_size}; "
                             f"their product must equal the number of ranks: change them so it is {world_size}, "
                             "or set dp_degree=-1 to take the leftover ranks")
        data = degrees["dp"] * degrees["sharding"]
        if data % h.ep_degree:  # ep groups are carved out of the data ranks, so it adds no axis here
            raise ValueError(f"ep_degree {h.ep_degree} does not divide the data ranks dp_degree {degrees['dp']} x "
                             f"sharding_degree {degrees['sharding']} = {data}: expert parallel groups are carved out "
                             f"of them; use an ep_degree that divides {data}")
        return degrees

    def validate_for_model(self, num_heads: int, num_layers: int, vocab_size: int,
                           degrees: Mapping[str, int], num_kv_heads: int | None = None,
                           num_experts: int | None = None) -> None:
        """Check that the model can be split as ``degrees`` (from :meth:`resolve_degrees`) says.

        Raises one ValueError listing every problem, so all can be fixed in one go. An axis missing
        from ``degrees`` counts as 1. sequence_parallel at mp 1 is allowed: it is a no-op.
        ``num_kv_heads`` is the key / value head count of grouped-query attention (None: as many
        as ``num_heads``). ``num_experts``: the routed experts of a Mixture-of-Experts model
        (``config.moe_shape().num_experts``), None for a dense model.
        """
        for name, value in (("num_heads", num_heads), ("num_layers", num_layers), ("vocab_size", vocab_size)):
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        unknown = sorted(set(degrees) - set(AXES), key=str)
        if unknown:
            raise ValueError(f"unknown degree key(s) {unknown}; allowed: {list(AXES)} (as resolve_degrees returns)")
        for axis in AXES:
            if not _is_int(degrees.get(axis, 1)) or degrees.get(axis, 1) < 1:
                raise ValueError(f"degrees[{axis!r}] must be an integer >= 1 (fill -1 with resolve_degrees first), "
                                 f"got {degrees[axis]!r}")
        mp, pp = degrees.get("mp", 1), degrees.get("pp", 1)
        vpp, micro = self.pipeline_configs.virtual_pp_degree, self.pipeline_configs.accumulate_steps
        problems = []
        if num_heads % mp:  # tensor parallel attention gives each mp rank whole heads
            divisors = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
            problems.append(f"mp_degree {mp} does not divide the model's {num_heads} attention heads; use one of {divisors}")
        if num_kv_heads is not None and num_kv_heads != num_heads and num_kv_heads % mp:
            divisors = [d for d in range(1, num_kv_heads + 1) if num_kv_heads % d == 0]
            problems.append(f"mp_degree {mp} does not divide the model's {num_kv_heads} key/value heads "
                            f"(num_key_value_heads): tensor parallel gives each mp rank whole KV heads; use one of "
                            f"{divisors}")
        if vocab_size % mp:
            padded = -(-vocab_size // mp) * mp
            problems.append(f"mp_degree {mp} does not divide vocab_size {vocab_size}: the vocabulary-parallel embedding "
                            f"gives each mp rank an equal slice of the vocabulary; pad the vocabulary to a multiple "
                            f"of {mp} (e.g. vocab_size={padded})")
        if num_layers < pp * vpp:
            problems.append(f"num_layers {num_layers} is fewer than pp_degree {pp} x virtual_pp_degree {vpp} = "
                            f"{pp * vpp} pipeline chunks, and each chunk needs at least one layer; lower pp_degree "
                            "or virtual_pp_degree")
        if pp > 1 and micro < pp:  # with fewer, some stages never have a micro-batch to work on
            problems.append(f"micro-batches fewer than pipeline stages: pipeline_configs accumulate_steps={micro} "
                            f"(micro-batches per step) < pp_degree {pp}; set accumulate_steps >= {pp}")
        ep = self.hybrid_configs.ep_degree
        data = degrees.get("dp", 1) * degrees.get("sharding", 1)
        if ep > 1 and num_experts is None:
            problems.append(f"ep_degree {ep} splits the experts of a Mixture-of-Experts model, but this model is "
                            "dense (its config has no moe_shape); set ep_degree 1")
        elif num_experts is not None and num_experts % ep:
            divisors = [d for d in range(1, num_experts + 1) if num_experts % d == 0 and data % d == 0]
            problems.append(f"ep_degree {ep} does not divide the model's {num_experts} experts: each expert "
                            f"parallel rank holds an equal share of them; use one of {divisors}")
        if data % ep:
            problems.append(f"ep_degree {ep} does not divide the data ranks dp x sharding = {data}: expert "
                            "parallel groups are carved out of them")
        if problems:
            raise ValueError("the strategy does not fit the model:\n  - " + "\n  - ".join(problems))

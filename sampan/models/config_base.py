"""Shared machinery for typed, validated model configs."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

C = TypeVar("C", bound="ModelConfig")


@dataclasses.dataclass(frozen=True)
class MoEShape:
    """What a Mixture-of-Experts model's MLPs are, as the planner and the zoo read it (torch-free).

    Fields:
        num_experts: routed experts per MoE layer ``E``.
        top_k: experts each token is sent to.
        expert_intermediate_size: SwiGLU width of one routed expert.
        shared_intermediate_size: SwiGLU width of the shared-expert MLP every token also runs
            (all shared experts together; 0 when there are none).
        moe_layers: indices of the layers whose MLP is an MoE block; the others are dense.
        dense_intermediate_size: SwiGLU width of the dense layers' MLP.
        score_func: "softmax" or "sigmoid" router scores.
        capacity_factor: None when dropless, else the expert capacity factor.
    """

    num_experts: int
    top_k: int
    expert_intermediate_size: int
    shared_intermediate_size: int
    moe_layers: tuple[int, ...]
    dense_intermediate_size: int
    score_func: str = "softmax"
    capacity_factor: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"MoEShape.top_k must be in [1, num_experts={self.num_experts}], got {self.top_k}")


@dataclasses.dataclass
class ModelConfig:
    """Base for model configs: validation helpers and lossless dict / JSON round trips.

    Subclasses are dataclasses whose fields are documented in their class docstring, validated in
    ``__post_init__``, and whose ``num_parameters`` / ``flops_per_token`` are closed-form.
    """

    model_type: ClassVar[str] = ""
    HEADS: ClassVar[tuple[str, ...]] = ()

    # What a block is made of, as the planner prices it: these defaults are the GPT / BERT block
    # (LayerNorm with bias, biased q / k / v / out and a 2-matrix MLP); a family whose blocks
    # differ overrides them (class attributes or fields), so the planner needs no per-family code.
    # They carry no annotation here on purpose: annotated, they would become the first fields of
    # every subclass that redefines them as fields.
    gated_mlp = False  # three MLP matrices (gate and up h -> ffn, down ffn -> h) instead of two
    norm_kind = "layernorm"  # "layernorm" (weight and bias) or "rmsnorm" (weight only)
    qkv_bias = True
    out_bias = True
    mlp_bias = True
    qk_norm = False  # per-head RMSNorm of q and k (two head_dim weights per layer)

    def moe_shape(self) -> MoEShape | None:
        """The model's Mixture-of-Experts layout, or None for a dense model (the default)."""
        return None

    def num_active_parameters(self, head: str | None = None) -> int:
        """Parameters one token uses in a forward pass (an MoE model counts ``top_k`` routed
        experts per MoE layer, not all of them); a dense model's ``num_parameters``."""
        return self.num_parameters(head)  # type: ignore[attr-defined]

    @property
    def position_table_rows(self) -> int:
        """Rows of the learned position-embedding table (0 for rotary positions)."""
        return getattr(self, "max_position_embeddings", 0)

    # -- validation helpers -------------------------------------------------------------------
    def _positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{type(self).__name__}.{name} must be a positive integer, got {value!r}")

    def _non_negative(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{type(self).__name__}.{name} must be an integer >= 0, got {value!r}")

    def _probability(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{type(self).__name__}.{name} must be in [0, 1), got {value!r}")

    def _positive_float(self, *names: str, allow_zero: bool = False) -> None:
        for name in names:
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not ok or value < 0 or (value == 0 and not allow_zero):
                rule = ">= 0" if allow_zero else "> 0"
                raise ValueError(f"{type(self).__name__}.{name} must be a number {rule}, got {value!r}")

    def _token_id(self, *names: str) -> None:
        vocab = self.vocab_size  # type: ignore[attr-defined]
        for name in names:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab):
                raise ValueError(f"{type(self).__name__}.{name} must be an integer in [0, vocab_size={vocab}) "
                                 f"or None, got {value!r}")

    def _divisible(self, name: str, by: str) -> None:
        a, b = getattr(self, name), getattr(self, by)
        if a % b:
            raise ValueError(
                f"{type(self).__name__}.{name} ({a}) must be divisible by {by} ({b}); "
                f"allowed {by} values for this {name}: {[d for d in range(1, min(a, 256) + 1) if a % d == 0]}"
            )

    def _check_head(self, head: str | None) -> str:
        head = head or self.HEADS[0]
        if head not in self.HEADS:
            raise ValueError(f"unknown head {head!r} for {self.model_type}; allowed: {list(self.HEADS)}")
        return head

    # -- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON dict of every field plus ``model_type``."""
        return {"model_type": self.model_type, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """Build from a dict; an unknown key is an error that names it (never silently dropped)."""
        data = dict(data)
        model_type = data.pop("model_type", cls.model_type)
        if model_type != cls.model_type:
            raise ValueError(f"config is for model_type {model_type!r}, not {cls.model_type!r}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; allowed: {sorted(fields)}")
        return cls(**data)

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied and validated (unknown fields are errors).

        A field that was derived from others follows them unless it is changed too: a feed-forward
        width that was the default ``4 * hidden_size`` follows a new ``hidden_size`` (and a
        Llama-family ``head_dim`` / ``num_kv_heads`` follow the width and head count).
        """
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise ValueError(f"unknown {type(self).__name__} field(s) {unknown}; allowed: {sorted(fields)}")
        return dataclasses.replace(self, **self._follow_defaults(dict(changes)))

    def _follow_defaults(self, changes: dict[str, Any]) -> dict[str, Any]:
        """``changes`` plus the derived fields that must follow them (see ``replace``)."""
        if ("hidden_size" in changes and "intermediate_size" not in changes
                and getattr(self, "intermediate_size", None) == 4 * getattr(self, "hidden_size", 0)):
            changes["intermediate_size"] = 0
        return changes

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, ensure_ascii=False)

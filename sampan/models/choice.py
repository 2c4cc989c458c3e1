"""``ModelChoice``: which registered model a run builds, and the config fields it changes.

Run files spell it as a ``[model]`` table (``name = "gpt-tiny"`` beside the fields to change),
``sampan pretrain`` as ``--model ernie-tiny --override num_layers=2``, and configs nest it
(``PretrainConfig.model``, ``RunConfig.model``). Torch-free: reading it builds nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass
class ModelChoice:
    """A registered model config (``sampan models``) and the fields of it to change.

    Fields:
        name: a name from ``sampan models`` (e.g. "ernie-tiny", "gpt-tiny", "qwen2.5-0.5b").
        overrides: config fields to change, e.g. {"num_layers": 2, "dropout": 0.0}.
    """

    name: str
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"model name must be a name from `sampan models`, got {self.name!r}")
        if not isinstance(self.overrides, Mapping):
            raise ValueError(f"model overrides must be a mapping of config fields, got {self.overrides!r}")
        self.overrides = dict(self.overrides)

    @classmethod
    def of(cls, value: str | Mapping[str, Any] | ModelChoice) -> ModelChoice:
        """A name, a ``{"name": ..., "overrides": {...}}`` mapping, or a run file's ``[model]`` table
        (the name beside the fields to change) as a ``ModelChoice``."""
        if isinstance(value, ModelChoice):
            return value
        if isinstance(value, str):
            return cls(value)
        if not isinstance(value, Mapping) or "name" not in value:
            raise ValueError(f"a model is a name from `sampan models` or a table with name = ..., got {value!r}")
        table = dict(value)
        name, overrides = table.pop("name"), dict(table.pop("overrides", None) or {})
        return cls(name, {**table, **overrides})

    def table(self) -> dict[str, Any]:
        """The run file form: ``{"name": ..., **overrides}``."""
        return {"name": self.name, **self.overrides}

    def create(self, **fields: Any):
        """Build the model (``sampan.models.create``); ``fields`` change the config further."""
        from sampan.models.registry import create

        return create(self.name, **{**self.overrides, **fields})

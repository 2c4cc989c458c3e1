"""``ModelSpec``: everything a model family hands the rest of sampan, in one place.

A family is one folder, ``sampan/models/<family>/``:

* ``config.py``: the typed config and its named configs (no torch import, so the planner and
  ``sampan models`` stay fast);
* ``modeling.py``: the model, one class per head, with no parallelism in it;
* ``parallelize.py``: how it splits: ``tensor_parallel_plan(model)``,
  ``sequence_parallel_plan(model)`` and ``pipeline_parts(model)``;
* ``hf.py``: its Hugging Face adapter (config mapping and state-dict names, both ways; see
  :class:`HFAdapter`);
* ``__init__.py``: ``SPEC``, this class filled in.

``sampan.models.registry`` lists the families (one line each). Nothing outside a family's folder
asks which model class it holds: fleet, the Trainer, the planner, export and the HF loader read
the spec (as torchtitan's ``ModelSpec`` does). Module paths are strings, imported on first use,
so reading a spec imports no torch.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol

from sampan.models.config_base import ModelConfig


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    loaded = importlib.import_module(module)
    return getattr(loaded, name) if name else loaded


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One model family.

    Fields:
        family: the name configs carry as ``model_type`` ("gpt", "ernie", "llama").
        config_class: the family's config (a torch-free ``ModelConfig`` dataclass).
        configs: named configs the registry offers (``"qwen2.5-7b" -> LlamaConfig(...)``).
        heads: head name -> ``"module:Class"``, in the order of ``config_class.HEADS`` (the first
            is the default).
        parallelize: module with ``tensor_parallel_plan``, ``sequence_parallel_plan`` and
            ``pipeline_parts`` (each takes the model; None where the family cannot split so).
        hf: module implementing :class:`HFAdapter`, or None when the family has no Hugging Face
            counterpart.
        hf_model_types: the HF ``model_type`` values ``hf`` reads (``"qwen2"``, ``"bert"``, ...).
        summary: one line for ``sampan models``.
    """

    family: str
    config_class: type[ModelConfig]
    configs: Mapping[str, ModelConfig]
    heads: Mapping[str, str]
    parallelize: str
    hf: str | None = None
    hf_model_types: tuple[str, ...] = ()
    summary: str = ""

    def __post_init__(self) -> None:
        if self.config_class.model_type != self.family:
            raise ValueError(f"ModelSpec {self.family!r}: config_class.model_type is "
                             f"{self.config_class.model_type!r}; they must be the same name")
        if tuple(self.heads) != tuple(self.config_class.HEADS):
            raise ValueError(f"ModelSpec {self.family!r}: heads {list(self.heads)} must list "
                             f"{self.config_class.__name__}.HEADS {list(self.config_class.HEADS)} in order")
        for name, config in self.configs.items():
            if not isinstance(config, self.config_class):
                raise TypeError(f"ModelSpec {self.family!r}: named config {name!r} is a {type(config).__name__}, "
                                f"not a {self.config_class.__name__}")
        if bool(self.hf) != bool(self.hf_model_types):
            raise ValueError(f"ModelSpec {self.family!r}: give hf and hf_model_types together")

    def model_class(self, head: str | None = None) -> type:
        """The model class for ``head`` (default: the family's first head); imports torch."""
        head = head or next(iter(self.heads))
        if head not in self.heads:
            raise ValueError(f"unknown head {head!r} for {self.family}; allowed: {list(self.heads)}")
        return _load(self.heads[head])

    def parallel(self) -> ModuleType:
        """The family's ``parallelize`` module (imports torch)."""
        return _load(self.parallelize)

    def hf_adapter(self) -> HFAdapter:
        """The family's Hugging Face adapter; a clear error when it has none."""
        if self.hf is None:
            raise ValueError(f"the {self.family} family has no Hugging Face counterpart to convert to or from")
        return _load(self.hf)


class HFAdapter(Protocol):
    """What a family's ``hf.py`` provides (module-level functions).

    Import maps one checkpoint tensor at a time, so a sharded checkpoint streams shard by shard;
    export maps the whole state dict (the model is in memory then anyway).
    """

    def config_from_hf(self, hf_config: Mapping[str, Any]) -> ModelConfig:
        """The sampan config of an HF ``config.json``; an unsupported setting is an error naming it."""

    def head_from_hf(self, hf_config: Mapping[str, Any], tensor_names: set[str]) -> str:
        """Which head the checkpoint holds (from ``architectures``, else its tensors)."""

    def tensor_from_hf(self, name: str, tensor: Any, config: ModelConfig, head: str) -> list[tuple[str, Any]]:
        """One HF tensor as sampan ``(name, tensor)`` pairs: usually one, several when HF fuses
        what sampan keeps apart, none for tensors that are not weights (buffers). A name the
        adapter does not know raises ``KeyError``."""

    def config_to_hf(self, config: ModelConfig, head: str) -> dict[str, Any]:
        """The HF ``config.json`` (with ``model_type`` and ``architectures``) for ``config`` and ``head``;
        a config HF cannot express is an error saying which field and why."""

    def state_to_hf(self, state: Mapping[str, Any], config: ModelConfig, head: str) -> dict[str, Any]:
        """The HF state dict for sampan's ``state`` (tied aliases already removed)."""

    # Optional: ``tokenizer_problem(config, tokenizer_json) -> str | None``, why transformers would
    # read a tokenizer saved beside this model differently (``save_pretrained`` refuses it then).

"""The model families, their named configs (from tiny test models to Llama 3 405B), and ``create``.

Importing this module imports no torch: the families' specs and configs are torch-free, so
``sampan plan --model qwen2.5-72b`` and ``sampan models`` answer without paying for it. Only
``create`` (which builds a model) imports torch.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any

from sampan.models.config_base import ModelConfig
from sampan.models.spec import ModelSpec
from sampan.utils.names import did_you_mean

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from sampan.tensor import DTypeLike

# One line per family: adding a family is its folder plus a line here.
FAMILY_PACKAGES = (
    "sampan.models.gpt",
    "sampan.models.ernie",
    "sampan.models.llama",
    "sampan.models.ernie4_5",
    "sampan.models.deepseek_v3",
    "sampan.models.qwen_moe",
)

FAMILIES: dict[str, ModelSpec] = {}
_CONFIGS: dict[str, ModelConfig] = {}


def _load_families() -> None:
    for package in FAMILY_PACKAGES:
        spec: ModelSpec = importlib.import_module(package).SPEC
        if spec.family in FAMILIES:
            raise ValueError(f"two families are called {spec.family!r} ({package})")
        FAMILIES[spec.family] = spec
        for name, config in spec.configs.items():
            register_config(name, config)


def get_spec(family: str) -> ModelSpec:
    """The spec of a family by name ("gpt", "ernie", "llama")."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; {did_you_mean(family, FAMILIES)}"
                         f"families: {sorted(FAMILIES)}")
    return FAMILIES[family]


def spec_of(model_or_config: Any) -> ModelSpec | None:
    """The spec of a sampan model (or config), or None for a model sampan doesn't know.

    Decided by the config's family name and class, never by the model's class, so a subclass or
    a wrapped copy of a family's model is still recognised.
    """
    config = model_or_config if isinstance(model_or_config, ModelConfig) else getattr(model_or_config, "config", None)
    if not isinstance(config, ModelConfig):
        return None
    spec = FAMILIES.get(config.model_type)
    return spec if spec is not None and isinstance(config, spec.config_class) else None


def spec_for_hf_model_type(model_type: str) -> ModelSpec:
    """The family that reads Hugging Face checkpoints of ``model_type`` ("qwen2", "bert", ...)."""
    for spec in FAMILIES.values():
        if model_type in spec.hf_model_types:
            return spec
    known = sorted(t for s in FAMILIES.values() for t in s.hf_model_types)
    raise ValueError(f"Hugging Face model_type {model_type!r} is not supported; "
                     f"{did_you_mean(model_type, known)}sampan reads: {', '.join(known)}")


def architecture_class(name: str) -> type | None:
    """The model class a sampan directory's ``architecture`` names (``"LlamaForCausalLM"``), found
    through the families' specs (importing that family's modeling), or None."""
    for spec in FAMILIES.values():
        for head, path in spec.heads.items():
            if path.rpartition(":")[2] == name:
                return spec.model_class(head)
    return None


def architecture_names() -> list[str]:
    """Every architecture name the families' heads give."""
    return sorted(path.rpartition(":")[2] for spec in FAMILIES.values() for path in spec.heads.values())


def register_config(name: str, config: ModelConfig, overwrite: bool = False) -> None:
    """Make ``config`` available as ``name`` to ``get_config`` / ``create``."""
    if name in _CONFIGS and not overwrite:
        raise ValueError(f"model name {name!r} is already registered; pass overwrite=True to replace it")
    _CONFIGS[name] = config


def list_models() -> list[str]:
    """Names of all registered model configs."""
    return sorted(_CONFIGS)


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """A fresh copy of the config registered as ``name``, with ``overrides`` applied and validated."""
    if name not in _CONFIGS:
        raise ValueError(f"unknown model name {name!r}; {did_you_mean(name, _CONFIGS)}"
                         f"known names: {', '.join(list_models())}")
    return _CONFIGS[name].replace(**overrides)


def create(name_or_config: str | ModelConfig, device: str | torch.device | None = None,
           dtype: DTypeLike = None, head: str | None = None, **overrides: Any):
    """Build a model from a registered name or a config.

    ``head`` picks the task head (the family's first by default: GPT and Llama "causal_lm", ERNIE
    "masked_lm"; ``sampan models`` lists them). ``device="meta"`` builds the structure without
    allocating memory, so even ``llama3-405b`` takes seconds. ``overrides`` change config fields
    (``create("gpt-tiny", vocab_size=5000)``).
    """
    import torch

    from sampan.tensor import to_dtype

    if isinstance(name_or_config, str):
        config = get_config(name_or_config, **overrides)
    elif isinstance(name_or_config, ModelConfig):
        config = name_or_config.replace(**overrides) if overrides else name_or_config
    else:
        raise TypeError(f"create() takes a model name or a ModelConfig, got {type(name_or_config).__name__}")
    spec = spec_of(config)
    if spec is None:
        raise ValueError(f"{type(config).__name__} (model_type {config.model_type!r}) belongs to no registered family; "
                         f"families: {sorted(FAMILIES)}")
    model_cls = spec.model_class(config._check_head(head))
    dtype = to_dtype(dtype)
    device_ctx = torch.device(device) if device is not None else contextlib.nullcontext()
    previous = torch.get_default_dtype()
    try:
        if dtype is not None:
            torch.set_default_dtype(dtype)
        with device_ctx:
            model = model_cls(config)
    finally:
        torch.set_default_dtype(previous)
    return model


_load_families()

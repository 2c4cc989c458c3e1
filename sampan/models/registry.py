"""Named model configs, from tiny test models to GPT-3 175B, and ``create``."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from sampan.models.config_base import ModelConfig
from sampan.models.ernie.config import ErnieConfig
from sampan.models.ernie.modeling import (
    ErnieForMaskedLM,
    ErnieForSequenceClassification,
    ErnieForTokenClassification,
    ErnieModel,
)
from sampan.models.gpt.config import GPTConfig
from sampan.models.gpt.modeling import GPTForCausalLM, GPTModel
from sampan.models.pretrained import PretrainedModel
from sampan.tensor import DTypeLike, to_dtype

# (family, head) -> model class. Each family's first head in its config's HEADS is the default.
MODEL_CLASSES: dict[tuple[str, str], type[PretrainedModel]] = {
    ("gpt", "causal_lm"): GPTForCausalLM,
    ("gpt", "none"): GPTModel,
    ("ernie", "masked_lm"): ErnieForMaskedLM,
    ("ernie", "none"): ErnieModel,
    ("ernie", "sequence_classification"): ErnieForSequenceClassification,
    ("ernie", "token_classification"): ErnieForTokenClassification,
}

_CONFIGS: dict[str, ModelConfig] = {}


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
        raise ValueError(f"unknown model name {name!r}; known names: {', '.join(list_models())}")
    return _CONFIGS[name].replace(**overrides)


def create(name_or_config: str | ModelConfig, device: str | torch.device | None = None,
           dtype: DTypeLike = None, head: str | None = None, **overrides: Any) -> PretrainedModel:
    """Build a model from a registered name or a config.

    ``head`` picks the task head (GPT: "causal_lm" default, "none"; ERNIE: "masked_lm" default,
    "none", "sequence_classification", "token_classification"). ``device="meta"`` builds the
    structure without allocating memory, so even ``gpt-175b`` takes seconds. ``overrides`` change
    config fields (``create("gpt-tiny", vocab_size=5000)``).
    """
    if isinstance(name_or_config, str):
        config = get_config(name_or_config, **overrides)
    elif isinstance(name_or_config, ModelConfig):
        config = name_or_config.replace(**overrides) if overrides else name_or_config
    else:
        raise TypeError(f"create() takes a model name or a ModelConfig, got {type(name_or_config).__name__}")
    head = config._check_head(head)
    model_cls = MODEL_CLASSES[(config.model_type, head)]
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


# --- the zoo ---------------------------------------------------------------------------------
# ERNIE shapes follow BERT-Chinese (vocab 21128); ernie-tiny is sized for CPU training.
register_config("ernie-tiny", ErnieConfig(hidden_size=256, num_layers=4, num_heads=4))
register_config("ernie-base", ErnieConfig())
register_config("ernie-large", ErnieConfig(hidden_size=1024, num_layers=24, num_heads=16))
# GPT shapes follow GPT-2 (small) and GPT-3 (Brown et al. 2020, table 2.1; 1.3B with 16 heads as in
# Megatron); gpt-100b is a 100B-class shape (80 layers x 10240) between 13B and 175B.
register_config("gpt-tiny", GPTConfig(vocab_size=8192, hidden_size=128, num_layers=4, num_heads=4,
                                      max_position_embeddings=256))
register_config("gpt-small", GPTConfig())
register_config("gpt-medium", GPTConfig(hidden_size=1024, num_layers=24, num_heads=16))
register_config("gpt-1.3b", GPTConfig(hidden_size=2048, num_layers=24, num_heads=16, max_position_embeddings=2048))
register_config("gpt-13b", GPTConfig(hidden_size=5120, num_layers=40, num_heads=40, max_position_embeddings=2048))
register_config("gpt-100b", GPTConfig(hidden_size=10240, num_layers=80, num_heads=80, max_position_embeddings=2048))
register_config("gpt-175b", GPTConfig(hidden_size=12288, num_layers=96, num_heads=96, max_position_embeddings=2048))

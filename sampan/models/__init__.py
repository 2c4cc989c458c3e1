"""The model zoo: ERNIE and GPT families, a registry of named configs, save / load.

    import sampan
    model = sampan.models.create("gpt-tiny")
    model.save_pretrained("out/gpt-tiny")
    same = sampan.models.from_pretrained("out/gpt-tiny")
"""

from sampan.models.config_base import ModelConfig
from sampan.models.ernie import (
    ErnieConfig,
    ErnieForMaskedLM,
    ErnieForSequenceClassification,
    ErnieForTokenClassification,
    ErnieModel,
)
from sampan.models.gpt import GPTConfig, GPTForCausalLM, GPTModel
from sampan.models.pretrained import PretrainedModel, from_pretrained
from sampan.models.registry import create, get_config, list_models, register_config

__all__ = [
    "ErnieConfig",
    "ErnieForMaskedLM",
    "ErnieForSequenceClassification",
    "ErnieForTokenClassification",
    "ErnieModel",
    "GPTConfig",
    "GPTForCausalLM",
    "GPTModel",
    "ModelConfig",
    "PretrainedModel",
    "create",
    "from_pretrained",
    "get_config",
    "list_models",
    "register_config",
]

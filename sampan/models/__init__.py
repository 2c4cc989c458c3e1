"""The model zoo: GPT, ERNIE and Llama / Qwen families, named configs, save / load (sampan and HF).

    import sampan
    model = sampan.models.create("qwen2.5-0.5b")            # or "gpt-tiny", "llama3-405b" (device="meta")
    model.save_pretrained("out/qwen", format="hf")          # transformers opens it as it is
    same = sampan.models.from_pretrained("out/qwen")        # sampan or Hugging Face directories

The registry, specs and configs load without torch (``sampan plan`` and ``sampan models`` stay
fast); the model classes and ``from_pretrained`` load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sampan.models.config_base import ModelConfig
from sampan.models.ernie.config import ErnieConfig
from sampan.models.gpt.config import GPTConfig
from sampan.models.llama.config import LlamaConfig
from sampan.models.registry import create, get_config, get_spec, list_models, register_config, spec_of
from sampan.models.spec import ModelSpec
from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.models.ernie.modeling import (
        ErnieForMaskedLM,
        ErnieForSequenceClassification,
        ErnieForTokenClassification,
        ErnieModel,
    )
    from sampan.models.gpt.modeling import GPTForCausalLM, GPTModel
    from sampan.models.llama.modeling import LlamaForCausalLM, LlamaModel
    from sampan.models.pretrained import PretrainedModel, from_pretrained

_EXPORTERS = {
    "ErnieForMaskedLM": "sampan.models.ernie.modeling",
    "ErnieForSequenceClassification": "sampan.models.ernie.modeling",
    "ErnieForTokenClassification": "sampan.models.ernie.modeling",
    "ErnieModel": "sampan.models.ernie.modeling",
    "GPTForCausalLM": "sampan.models.gpt.modeling",
    "GPTModel": "sampan.models.gpt.modeling",
    "LlamaForCausalLM": "sampan.models.llama.modeling",
    "LlamaModel": "sampan.models.llama.modeling",
    "PretrainedModel": "sampan.models.pretrained",
    "from_pretrained": "sampan.models.pretrained",
}


__getattr__ = lazy_exports(__name__, _EXPORTERS)


__all__ = [
    "ErnieConfig",
    "ErnieForMaskedLM",
    "ErnieForSequenceClassification",
    "ErnieForTokenClassification",
    "ErnieModel",
    "GPTConfig",
    "GPTForCausalLM",
    "GPTModel",
    "LlamaConfig",
    "LlamaForCausalLM",
    "LlamaModel",
    "ModelConfig",
    "ModelSpec",
    "PretrainedModel",
    "create",
    "from_pretrained",
    "get_config",
    "get_spec",
    "list_models",
    "register_config",
    "spec_of",
]

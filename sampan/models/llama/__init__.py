"""The Llama family: Llama 2 / 3 / 3.1, Qwen2 / Qwen2.5 and Qwen3 decoders, and their HF checkpoints.

The spec and configs load without torch; the model classes load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sampan.models.llama.config import CONFIGS, LlamaConfig
from sampan.models.spec import ModelSpec as _ModelSpec
from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.models.llama.modeling import LlamaForCausalLM, LlamaModel

_EXPORTERS = {"LlamaForCausalLM": "sampan.models.llama.modeling", "LlamaModel": "sampan.models.llama.modeling"}

SPEC = _ModelSpec(
    family="llama",
    config_class=LlamaConfig,
    configs=CONFIGS,
    heads={"causal_lm": "sampan.models.llama.modeling:LlamaForCausalLM",
           "none": "sampan.models.llama.modeling:LlamaModel"},
    parallelize="sampan.models.llama.parallelize",
    hf="sampan.models.llama.hf",
    hf_model_types=("llama", "qwen2", "qwen3"),
    summary="Llama / Qwen decoder: RoPE, RMSNorm, grouped-query attention, SwiGLU",
)


__getattr__ = lazy_exports(__name__, _EXPORTERS)


__all__ = ["CONFIGS", "SPEC", "LlamaConfig", "LlamaForCausalLM", "LlamaModel"]

"""The Qwen-MoE family: Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B) and Qwen3-MoE decoders, and their HF checkpoints.

The spec and configs load without torch; the model classes load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sampan.models.qwen_moe.config import CONFIGS, QwenMoeConfig
from sampan.models.spec import ModelSpec as _ModelSpec
from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.models.qwen_moe.modeling import QwenMoeForCausalLM, QwenMoeModel

_EXPORTERS = {"QwenMoeForCausalLM": "sampan.models.qwen_moe.modeling",
              "QwenMoeModel": "sampan.models.qwen_moe.modeling"}

SPEC = _ModelSpec(
    family="qwen_moe",
    config_class=QwenMoeConfig,
    configs=CONFIGS,
    heads={"causal_lm": "sampan.models.qwen_moe.modeling:QwenMoeForCausalLM",
           "none": "sampan.models.qwen_moe.modeling:QwenMoeModel"},
    parallelize="sampan.models.qwen_moe.parallelize",
    hf="sampan.models.qwen_moe.hf",
    hf_model_types=("qwen2_moe", "qwen3_moe"),
    summary="Qwen2-MoE / Qwen3-MoE decoder: Qwen attention, softmax top-k experts (+ gated shared expert)",
)


__getattr__ = lazy_exports(__name__, _EXPORTERS)


__all__ = ["CONFIGS", "SPEC", "QwenMoeConfig", "QwenMoeForCausalLM", "QwenMoeModel"]

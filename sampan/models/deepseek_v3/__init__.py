"""DeepSeek-V3: multi-head latent attention, group-limited sigmoid MoE, multi-token prediction.

The spec and configs load without torch; the model classes load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sampan.models.deepseek_v3.config import CONFIGS, DeepseekV3Config
from sampan.models.spec import ModelSpec as _ModelSpec
from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.models.deepseek_v3.modeling import DeepseekV3ForCausalLM, DeepseekV3Model

_EXPORTERS = {"DeepseekV3ForCausalLM": "sampan.models.deepseek_v3.modeling",
              "DeepseekV3Model": "sampan.models.deepseek_v3.modeling"}

SPEC = _ModelSpec(
    family="deepseek_v3",
    config_class=DeepseekV3Config,
    configs=CONFIGS,
    heads={"causal_lm": "sampan.models.deepseek_v3.modeling:DeepseekV3ForCausalLM",
           "none": "sampan.models.deepseek_v3.modeling:DeepseekV3Model"},
    parallelize="sampan.models.deepseek_v3.parallelize",
    hf="sampan.models.deepseek_v3.hf",
    hf_model_types=("deepseek_v3",),
    summary="DeepSeek-V3: multi-head latent attention, sigmoid group-limited MoE, optional multi-token prediction",
)


__getattr__ = lazy_exports(__name__, _EXPORTERS)


__all__ = ["CONFIGS", "SPEC", "DeepseekV3Config", "DeepseekV3ForCausalLM", "DeepseekV3Model"]

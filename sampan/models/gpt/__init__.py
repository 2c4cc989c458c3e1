"""GPT: decoder-only causal language models (GPT-2 / GPT-3 layout).

The spec and configs load without torch; the model classes load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sampan.models.gpt.config import CONFIGS, GPTConfig
from sampan.models.spec import ModelSpec as _ModelSpec
from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.models.gpt.modeling import GPTForCausalLM, GPTModel

_EXPORTERS = {"GPTForCausalLM": "sampan.models.gpt.modeling", "GPTModel": "sampan.models.gpt.modeling"}

SPEC = _ModelSpec(
    family="gpt",
    config_class=GPTConfig,
    configs=CONFIGS,
    heads={"causal_lm": "sampan.models.gpt.modeling:GPTForCausalLM", "none": "sampan.models.gpt.modeling:GPTModel"},
    parallelize="sampan.models.gpt.parallelize",
    hf="sampan.models.gpt.hf",
    hf_model_types=("gpt2",),
    summary="GPT-2 / GPT-3 decoder: learned positions, LayerNorm, GELU, tied head",
)


__getattr__ = lazy_exports(__name__, _EXPORTERS)


__all__ = ["CONFIGS", "SPEC", "GPTConfig", "GPTForCausalLM", "GPTModel"]

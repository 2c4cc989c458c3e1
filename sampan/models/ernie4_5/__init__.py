"""The ERNIE 4.5 family: Baidu's dense and Mixture-of-Experts decoders, and their HF checkpoints.

Not the BERT-style ERNIE 1.0 / 3.0 encoder (``sampan.models.ernie``). The spec and configs load
without torch; the model classes load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sampan.models.ernie4_5.config import CONFIGS, Ernie4_5Config
from sampan.models.spec import ModelSpec as _ModelSpec
from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.models.ernie4_5.modeling import Ernie4_5ForCausalLM, Ernie4_5Model

_EXPORTERS = {"Ernie4_5ForCausalLM": "sampan.models.ernie4_5.modeling",
              "Ernie4_5Model": "sampan.models.ernie4_5.modeling"}

SPEC = _ModelSpec(
    family="ernie4_5",
    config_class=Ernie4_5Config,
    configs=CONFIGS,
    heads={"causal_lm": "sampan.models.ernie4_5.modeling:Ernie4_5ForCausalLM",
           "none": "sampan.models.ernie4_5.modeling:Ernie4_5Model"},
    parallelize="sampan.models.ernie4_5.parallelize",
    hf="sampan.models.ernie4_5.hf",
    hf_model_types=("ernie4_5", "ernie4_5_moe"),
    summary="ERNIE 4.5 decoder (dense / MoE): interleaved RoPE, RMSNorm, GQA, SwiGLU or softmax top-k experts",
)


__getattr__ = lazy_exports(__name__, _EXPORTERS)


__all__ = ["CONFIGS", "SPEC", "Ernie4_5Config", "Ernie4_5ForCausalLM", "Ernie4_5Model"]

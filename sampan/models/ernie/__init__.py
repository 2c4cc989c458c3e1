"""ERNIE: BERT-style encoders for Chinese, with MLM and classification heads.

The spec and configs load without torch; the model classes load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sampan.models.ernie.config import CONFIGS, ErnieConfig
from sampan.models.spec import ModelSpec as _ModelSpec
from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.models.ernie.modeling import (
        ErnieForMaskedLM,
        ErnieForSequenceClassification,
        ErnieForTokenClassification,
        ErnieModel,
    )

_EXPORTERS = {"ErnieForMaskedLM": "sampan.models.ernie.modeling",
              "ErnieForSequenceClassification": "sampan.models.ernie.modeling",
              "ErnieForTokenClassification": "sampan.models.ernie.modeling",
              "ErnieModel": "sampan.models.ernie.modeling"}

SPEC = _ModelSpec(
    family="ernie",
    config_class=ErnieConfig,
    configs=CONFIGS,
    heads={"masked_lm": "sampan.models.ernie.modeling:ErnieForMaskedLM",
           "none": "sampan.models.ernie.modeling:ErnieModel",
           "sequence_classification": "sampan.models.ernie.modeling:ErnieForSequenceClassification",
           "token_classification": "sampan.models.ernie.modeling:ErnieForTokenClassification"},
    parallelize="sampan.models.ernie.parallelize",
    hf="sampan.models.ernie.hf",
    hf_model_types=("bert", "ernie", "roberta-prelayernorm"),
    summary="BERT / ERNIE encoder: MLM, sequence and token classification; pinyin / radical / stroke features",
)


__getattr__ = lazy_exports(__name__, _EXPORTERS)


__all__ = ["CONFIGS", "SPEC", "ErnieConfig", "ErnieForMaskedLM", "ErnieForSequenceClassification",
           "ErnieForTokenClassification", "ErnieModel"]

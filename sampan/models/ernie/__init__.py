"""ERNIE: BERT-style encoders for Chinese, with MLM and classification heads."""

from sampan.models.ernie.config import ErnieConfig
from sampan.models.ernie.hf_convert import from_hf_bert
from sampan.models.ernie.modeling import (
    ErnieForMaskedLM,
    ErnieForSequenceClassification,
    ErnieForTokenClassification,
    ErnieModel,
)

__all__ = [
    "ErnieConfig",
    "ErnieForMaskedLM",
    "ErnieForSequenceClassification",
    "ErnieForTokenClassification",
    "ErnieModel",
    "from_hf_bert",
]

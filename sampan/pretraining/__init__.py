"""ERNIE pretraining with knowledge masking, on a ``sampan data build`` (``sampan pretrain``)."""

from sampan.pretraining.batches import MaskedEvalDataset, MLMBatcher
from sampan.pretraining.config import PretrainConfig
from sampan.pretraining.run import build_model, pretrain
from sampan.pretraining.trainer import PretrainTrainer

__all__ = ["MLMBatcher", "MaskedEvalDataset", "PretrainConfig", "PretrainTrainer", "build_model", "pretrain"]

"""ERNIE pretraining with knowledge masking, on a ``sampan data build`` (``sampan pretrain``).

The names load on first use: ``PretrainConfig`` is plain data (the demo and the hub recipes nest
it, and ``sampan pretrain --help`` reads it) and must not import torch.
"""

from typing import TYPE_CHECKING

from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.pretraining.batches import MaskedEvalDataset, MLMBatcher
    from sampan.pretraining.config import PretrainConfig
    from sampan.pretraining.run import build_model, pretrain
    from sampan.pretraining.trainer import PretrainTrainer

__getattr__ = lazy_exports(__name__, {
    "MLMBatcher": "sampan.pretraining.batches", "MaskedEvalDataset": "sampan.pretraining.batches",
    "PretrainConfig": "sampan.pretraining.config", "build_model": "sampan.pretraining.run",
    "pretrain": "sampan.pretraining.run", "PretrainTrainer": "sampan.pretraining.trainer",
})

__all__ = ["MLMBatcher", "MaskedEvalDataset", "PretrainConfig", "PretrainTrainer", "build_model", "pretrain"]

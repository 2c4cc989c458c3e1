"""The training engine: ``Trainer``, ``TrainingArguments``, callbacks, recompute.

The names load on first use: ``TrainingArguments`` is plain data that every training config
nests, and reading it (``sampan finetune --help``, ``sampan hub list``) must not import torch.
"""

from typing import TYPE_CHECKING

from sampan.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from sampan.nn.recompute import apply_recompute
    from sampan.trainer.arguments import TrainingArguments, load_config_file
    from sampan.trainer.callbacks import (
        MetricsJsonlCallback,
        ProgressCallback,
        TensorBoardCallback,
        TrainerCallback,
    )
    from sampan.trainer.state import TrainerState
    from sampan.trainer.trainer import EvalPrediction, Trainer

__getattr__ = lazy_exports(__name__, {
    "apply_recompute": "sampan.nn.recompute",
    "TrainingArguments": "sampan.trainer.arguments",
    "load_config_file": "sampan.trainer.arguments",
    "MetricsJsonlCallback": "sampan.trainer.callbacks",
    "ProgressCallback": "sampan.trainer.callbacks",
    "TensorBoardCallback": "sampan.trainer.callbacks",
    "TrainerCallback": "sampan.trainer.callbacks",
    "TrainerState": "sampan.trainer.state",
    "EvalPrediction": "sampan.trainer.trainer",
    "Trainer": "sampan.trainer.trainer",
})

__all__ = [
    "EvalPrediction",
    "MetricsJsonlCallback",
    "ProgressCallback",
    "TensorBoardCallback",
    "Trainer",
    "TrainerCallback",
    "TrainerState",
    "TrainingArguments",
    "apply_recompute",
    "load_config_file",
]

"""The training engine: ``Trainer``, ``TrainingArguments``, callbacks, recompute."""

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

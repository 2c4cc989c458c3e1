"""The settings of ``sampan hub build ocr-rec-zh`` (the recipe itself is ``sampan.vision.train_rec``).

Kept apart and free of torch so that ``sampan hub build --help`` can list them without importing it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from sampan.trainer.arguments import TrainingArguments
from sampan.utils.config import nested, refuse_changes, resolve_nested
from sampan.vision.build import OcrDataConfig

NAME = "ocr-rec-zh"


@dataclasses.dataclass
class OcrRecRecipe:
    """ocr-rec-zh: the CTC line recogniser trained on the data engine's rendered lines.

    Fields:
        data: the training pool and the degraded held-out lines (``sampan data build-ocr``; pages
            are not used). Its test split holds only held-out fonts and documents.
        clean_test_lines: held-out lines rendered again with no degradation (same held-out fonts
            and documents), scored apart from the degraded ones.
        model: ``RecognizerConfig`` fields to change from its defaults (``{"hidden": 96}``; a nested
            ``backbone`` as a mapping); ``num_classes`` comes from the data's charset.
        training: the run (``Trainer`` arguments); with ``resume_from_checkpoint="auto"`` the same
            command continues an interrupted run from its newest checkpoint.
        eval_batch_size: lines per forward pass when scoring the held-out sets.
        export_only: skip training and write the store model from the run's best checkpoint so far
            (for a run that is still going or was stopped).
    """

    OWNED: ClassVar[dict[str, str]] = {
        "data.out": "set by the recipe ($SAMPAN_HOME/build/ocr-rec-data-<digest of the settings>)",
        "training.output_dir": f"set by the recipe ($SAMPAN_HOME/build/{NAME})"}

    # 30,000 lines render in ~5 min (one process, ~100-150 lines/s beside other jobs); the default
    # degradations leave ~17% of them clean. 8,000 steps of 32 lines are ~8.5 passes over them.
    data: OcrDataConfig = nested(OcrDataConfig, out="", train_lines=30000, test_lines=600, train_pages=0,
                                 test_pages=0)
    clean_test_lines: int = 300
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    training: TrainingArguments = nested(
        TrainingArguments, max_steps=8000, per_device_train_batch_size=32, learning_rate=1e-3,
        lr_scheduler="cosine", warmup_steps=300, min_lr_ratio=0.02, weight_decay=0.01, max_grad_norm=5.0,
        logging_steps=50, eval_steps=900, save_steps=300, save_total_limit=2, seed=0,
        resume_from_checkpoint="auto", group_by_length=True, tensorboard=False)
    eval_batch_size: int = 64
    export_only: bool = False

    def __post_init__(self) -> None:
        resolve_nested(self)
        refuse_changes(self)
        if self.clean_test_lines < 1 or self.data.test_lines < 1 or self.data.train_lines < 1:
            raise ValueError("data.train_lines, data.test_lines and clean_test_lines must each be >= 1: the "
                             "recipe trains on the first and scores on the other two")
        if self.eval_batch_size < 1:
            raise ValueError(f"eval_batch_size must be >= 1, got {self.eval_batch_size}")
        if "num_classes" in self.model:
            raise ValueError("model.num_classes is set by the recipe (the data's charset size + 1 for the blank); "
                             "leave it unset")

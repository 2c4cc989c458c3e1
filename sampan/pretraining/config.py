"""``PretrainConfig``: one ``sampan pretrain`` run, typed and validated."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from sampan.models.choice import ModelChoice
from sampan.text.features import FEATURE_NAMES
from sampan.text.masking import MaskingConfig, MaskingSchedule
from sampan.trainer.arguments import TrainingArguments
from sampan.utils.config import nested, resolve_nested

# The Trainer side of a pretraining run, where it differs from TrainingArguments' defaults: cosine
# decay to 10% after a short warmup, fp32 (bf16 is emulated, hence slow, on AVX2-only CPUs), a
# checkpoint only at the end unless asked, and the last two kept.
TRAINING_DEFAULTS = dict(output_dir="outputs/pretrain", max_steps=300, per_device_train_batch_size=16,
                         per_device_eval_batch_size=32, learning_rate=5e-4, lr_scheduler="cosine", warmup_steps=30,
                         min_lr_ratio=0.1, weight_decay=0.01, max_grad_norm=1.0, seed=0, save_steps=0,
                         save_total_limit=2)


@dataclasses.dataclass
class PretrainConfig:
    """MLM pretraining of an ERNIE model on a ``sampan data build``.

    Fields:
        model: a registered ERNIE config (``sampan models``), e.g. "ernie-tiny", and the config
            fields to change (``--override num_layers=2``).
        data: the data build directory.
        masking: "knowledge" (ERNIE's staged char -> phrase -> entity), one level ("char",
            "phrase", "entity") throughout, or stages "char:0.2,phrase:0.3,entity:0.5".
        mask: the masking budget and how masked units are replaced (``MaskingConfig``).
        features: Chinese character features to embed: any of "pinyin", "radical", "stroke".
        train_corpora: train on these corpora of the build only (default: all).
        pack: join short rows of the build into full ones (``sampan.pretraining.packing``): about
            1.8x the text per step at the same cost (the store's build is 45% padding).
        eval_rows: held-out rows evaluated (fixed char-level masking), 0 = all.
        training: the Trainer's side (``TrainingArguments``): steps, batch, learning rate and its
            schedule, checkpoints, resume, device, AMP. Its ``seed`` also seeds model init and masking.
    """

    # Keys of the flat form this config had before it nested TrainingArguments (run files and scripts
    # written for it get an error naming the new key).
    RENAMED: ClassVar[dict[str, str]] = {
        "output_dir": "training.output_dir", "max_steps": "training.max_steps", "steps": "training.max_steps",
        "batch_size": "training.per_device_train_batch_size", "learning_rate": "training.learning_rate",
        "warmup_steps": "training.warmup_steps", "eval_steps": "training.eval_steps",
        "save_steps": "training.save_steps", "logging_steps": "training.logging_steps", "seed": "training.seed",
        "resume": "training.resume_from_checkpoint", "overwrite": "training.overwrite_output_dir",
        "num_workers": "training.dataloader_num_workers", "amp": "training.amp", "device": "training.device",
        "compile": "training.compile", "model_overrides": "model.overrides", "mask_prob": "mask.mask_prob",
        "corpora": "train_corpora"}

    model: ModelChoice = nested(ModelChoice, name="ernie-tiny")
    data: str = "data/pretrain"
    masking: str = "knowledge"
    mask: MaskingConfig = nested(MaskingConfig, flatten=True)
    features: tuple[str, ...] = ()
    train_corpora: tuple[str, ...] = ()
    pack: bool = True
    eval_rows: int = 256
    training: TrainingArguments = nested(TrainingArguments, **TRAINING_DEFAULTS)

    def __post_init__(self) -> None:
        resolve_nested(self)
        for name in ("features", "train_corpora"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            setattr(self, name, tuple(value))
        bad = sorted(set(self.features) - set(FEATURE_NAMES))
        if bad:
            raise ValueError(f"features {bad} unknown; choose from {list(FEATURE_NAMES)}")
        MaskingSchedule.parse(self.masking)  # validates, with a message naming the problem
        if not isinstance(self.eval_rows, int) or self.eval_rows < 0:
            raise ValueError(f"eval_rows must be an integer >= 0, got {self.eval_rows!r}")
        if self.training.max_steps <= 0:
            raise ValueError("pretrain runs a fixed number of steps: set training.max_steps (> 0), "
                             f"got {self.training.max_steps}")

    def schedule(self) -> MaskingSchedule:
        return MaskingSchedule.parse(self.masking)

    def training_arguments(self) -> TrainingArguments:
        """The Trainer's arguments (``training``, with the eval batch at least the train batch)."""
        args = self.training
        if args.per_device_eval_batch_size < args.per_device_train_batch_size:
            args = dataclasses.replace(args, per_device_eval_batch_size=args.per_device_train_batch_size)
        return args

"""``PretrainConfig``: one ``sampan pretrain`` run, typed and validated."""

from __future__ import annotations

import dataclasses
from typing import Any

from sampan.text.features import FEATURE_NAMES
from sampan.text.masking import MaskingSchedule
from sampan.trainer.arguments import AMP_MODES, TrainingArguments


@dataclasses.dataclass
class PretrainConfig:
    """MLM pretraining of an ERNIE model on a ``sampan data build``.

    Fields:
        model: a registered ERNIE config (``sampan models``), e.g. "ernie-tiny".
        data: the data build directory.
        masking: "knowledge" (ERNIE's staged char -> phrase -> entity), one level ("char",
            "phrase", "entity") throughout, or stages "char:0.2,phrase:0.3,entity:0.5".
        features: Chinese character features to embed: any of "pinyin", "radical", "stroke".
        corpora: train on these corpora of the build only (default: all).
        output_dir: checkpoints, metrics.jsonl, TensorBoard, the final model.
        max_steps: optimizer steps.
        batch_size: rows per step.
        learning_rate: peak LR (linear warmup, then cosine decay to 10%).
        warmup_steps: warmup length.
        mask_prob: the masking budget (fraction of tokens per row).
        pack: join short rows of the build into full ones (``sampan.pretraining.packing``): about
            1.8x the text per step at the same cost (the store's build is 45% padding).
        eval_steps: steps between held-out evaluations (0: only at the end).
        eval_rows: held-out rows evaluated (fixed char-level masking), 0 = all.
        save_steps: steps between checkpoints (0: only at the end).
        logging_steps: steps between metric lines.
        seed: init, data order and masking.
        resume: continue the run in ``output_dir`` from its newest valid checkpoint.
        overwrite: start over, deleting an earlier run's checkpoints and metrics in ``output_dir``.
        num_workers: background data-loading processes.
        model_overrides: ERNIE config fields to change (e.g. {"num_layers": 2}).
        amp: None (fp32), "bf16", "fp16" or "auto" (bf16 where it is fast: GPUs, CPUs with
            AVX512-BF16 / AMX; see ``TrainingArguments.amp``).
        device: where to train: "auto" (a CUDA GPU when there is one, else the CPU), "cpu", "cuda"
            or "cuda:N".
        compile: ``torch.compile`` each transformer block (pays a compile time up front).
    """

    model: str = "ernie-tiny"
    data: str = "data/pretrain"
    masking: str = "knowledge"
    features: tuple[str, ...] = ()
    corpora: tuple[str, ...] = ()
    output_dir: str = "outputs/pretrain"
    max_steps: int = 300
    batch_size: int = 16
    learning_rate: float = 5e-4
    warmup_steps: int = 30
    mask_prob: float = 0.15
    pack: bool = True
    eval_steps: int = 0
    eval_rows: int = 256
    save_steps: int = 0
    logging_steps: int = 10
    seed: int = 0
    resume: bool = False
    overwrite: bool = False
    num_workers: int = 0
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    amp: str | None = None
    device: str = "auto"
    compile: bool = False

    def __post_init__(self) -> None:
        for name in ("features", "corpora"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            setattr(self, name, tuple(value))
        bad = sorted(set(self.features) - set(FEATURE_NAMES))
        if bad:
            raise ValueError(f"features {bad} unknown; choose from {list(FEATURE_NAMES)}")
        MaskingSchedule.parse(self.masking)  # validates, with a message naming the problem
        from sampan.utils.device import check_device_spec

        self.device = check_device_spec(self.device)
        if self.amp in ("none", ""):
            self.amp = None
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp must be one of {list(AMP_MODES)}, got {self.amp!r}")
        for name in ("max_steps", "batch_size", "logging_steps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_steps", "eval_rows", "save_steps", "num_workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite exclude each other: resume continues the run, overwrite deletes it")

    def schedule(self) -> MaskingSchedule:
        return MaskingSchedule.parse(self.masking)

    def training_arguments(self) -> TrainingArguments:
        """The Trainer side of the run (fp32 by default: bf16 is emulated, hence slow, on AVX2-only CPUs)."""
        return TrainingArguments(
            output_dir=self.output_dir, max_steps=self.max_steps, per_device_train_batch_size=self.batch_size,
            per_device_eval_batch_size=max(self.batch_size, 32), learning_rate=self.learning_rate,
            lr_scheduler="cosine", warmup_steps=min(self.warmup_steps, self.max_steps), min_lr_ratio=0.1,
            weight_decay=0.01, max_grad_norm=1.0, seed=self.seed, logging_steps=self.logging_steps,
            eval_steps=self.eval_steps, save_steps=self.save_steps or self.max_steps, save_total_limit=2,
            resume_from_checkpoint="auto" if self.resume else None, overwrite_output_dir=self.overwrite,
            dataloader_num_workers=self.num_workers, amp=self.amp, device=self.device, compile=self.compile,
        )

"""``TrainingArguments``: every knob of a training run, typed and validated."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

# Run files are read by utils' one config reader; imported from here too, where it was first defined.
from sampan.utils.config_files import load_config_file  # noqa: F401

LR_SCHEDULERS = ("linear", "cosine", "constant", "wsd")
AMP_MODES = (None, "auto", "bf16", "fp16")
RECOMPUTE_MODES = ("none", "full", "selective", "moe")


@dataclasses.dataclass
class TrainingArguments:
    """What a ``Trainer`` run does. Unknown keys in a config file are errors that name the key.

    Fields:
        output_dir: checkpoints, ``metrics.jsonl``, TensorBoard events and reports go here.
        max_steps: optimizer steps to run; -1 derives it from ``num_train_epochs``.
        num_train_epochs: epochs over the training set when ``max_steps`` is -1.
        max_minutes: wall-clock budget of one sitting, in minutes of this process's training loop:
            when a step ends past it, the run saves a checkpoint and stops short of ``max_steps``;
            rerun with ``resume_from_checkpoint="auto"`` to continue. The LR schedule still spans
            ``max_steps``, so a run split over sittings follows the same curve as one in a go.
            0 sets no budget. Not with a ``strategy`` (ranks would have to agree on the stop).
        per_device_train_batch_size: samples per micro-batch.
        per_device_eval_batch_size: samples per evaluation batch.
        gradient_accumulation_steps: micro-batches per optimizer step.
        learning_rate: peak learning rate.
        lr_scheduler: "linear" (warmup then linear decay to ``min_lr_ratio``), "cosine", "constant"
            (after warmup), or "wsd" (warmup-stable-decay; the last ``wsd_decay_ratio`` of steps decay).
        warmup_steps: linear warmup from 0 to ``learning_rate``.
        warmup_ratio: warmup as a fraction of the run's steps, used when ``warmup_steps`` is 0
            (Hugging Face's rule), in [0, 1).
        min_lr_ratio: the final learning rate as a fraction of ``learning_rate``.
        wsd_decay_ratio: fraction of ``max_steps`` spent decaying in the "wsd" schedule.
        weight_decay: AdamW decoupled weight decay (biases and norm weights are never decayed).
        adam_beta1 / adam_beta2 / adam_epsilon: AdamW hyper-parameters.
        max_grad_norm: clip the global gradient norm to this; 0 disables clipping (the norm is
            still logged).
        amp: None (fp32), "bf16" (autocast), "fp16" (autocast with dynamic loss scaling: a step
            whose gradients hold inf/nan is skipped and the scale lowered), or "auto": bf16 on a
            GPU with bf16 units (fp16 on an older one), and on the CPU bf16 only where its bf16
            matmuls are faster than fp32 (AVX512-BF16 / AMX), else fp32 (``sampan.amp.resolve_amp``).
        device: where to train: "auto" (this process's CUDA GPU when there is one, else the CPU;
            under ``torchrun`` / ``sampan launch`` rank r of a node takes ``cuda:$LOCAL_RANK``),
            "cpu", "cuda" or "cuda:N" (an error when that GPU is not there). The model is moved
            there before the optimizer is built; batches follow it (pinned memory, non-blocking
            copies on a GPU).
        compile: ``torch.compile`` each transformer block (after recompute is applied, before
            sharding, the order torchtitan uses). The first steps pay the compile time; see
            docs/gpu.md for when it pays back.
        recompute: "none", "full" (recompute every transformer block in backward), "selective"
            (keep matmul and attention outputs, recompute the cheap element-wise ops) or "moe"
            (recompute only the Mixture-of-Experts blocks: router, dispatch, experts, combine;
            an error for a model without any). With a strategy, "moe" is applied after fleet
            splits the model and leaves the strategy's own recompute "none".
        seed: seeds python, numpy and torch at the start, and the data order.
        logging_steps: steps between metric lines (progress, TensorBoard, ``metrics.jsonl``).
        eval_steps: steps between evaluations; 0 evaluates only at the end (when there is an
            eval dataset).
        save_steps: steps between checkpoints; 0 saves only at the end.
        save_total_limit: keep at most this many checkpoints (oldest deleted); None keeps all.
        resume_from_checkpoint: a checkpoint directory, "auto" (the newest one in ``output_dir``
            that passes its checksums, or a fresh start if there is none), or None.
        dataloader_num_workers: worker processes loading batches in the background.
        group_by_length: batch training samples of similar length together (the train dataset
            must have a ``lengths`` attribute, one int per sample), so variable-length text pads
            little; batches stay random at the scale of 50 batches.
        prefetch_factor: batches each worker loads ahead.
        max_nonfinite_steps: stop with an error after this many consecutive steps whose loss is
            inf/nan (each is skipped).
        deterministic: ``torch.use_deterministic_algorithms(True)`` for bit-exact reruns.
        peak_flops: one device's peak FLOP/s for MFU (the Trainer multiplies it by the world size).
            None: the datasheet dense peak of the GPU for the AMP dtype (an unknown GPU: no MFU),
            or on the CPU the processor's peak, FLOPs per cycle (SIMD width x FMA units, AMX for
            bf16) x cores in use x highest clock, from ``/proc/cpuinfo`` and never timed (unknown,
            e.g. no clock there: no MFU; see ``sampan.utils.hardware``). 0 turns MFU off. The
            peak never moves with the run or the load, so MFU over 100% (a wrong FLOP count or peak) shows.
        overwrite_output_dir: when not resuming, delete an earlier run's checkpoints, metrics and
            TensorBoard events in ``output_dir`` first; when False such leftovers are an error
            (so two runs never mix, and "auto" never resumes someone else's run).
        tensorboard: write TensorBoard event files under ``output_dir/tensorboard``.
        progress_bar: show a live progress bar on a terminal (plain log lines otherwise).
        strategy: train on a hybrid-parallel layout (run under ``sampan launch``): a Paddle-style
            ``DistributedStrategy`` dict, e.g. ``{"hybrid_configs": {"dp_degree": 2, "mp_degree": 2}}``
            (also ``sharding_configs``, ``pipeline_configs``, ``tensor_parallel_configs``,
            ``recompute``, ``amp``). Batch sizes stay per data-parallel rank; checkpoints become DCP
            shards that resume at any layout. None trains in this process alone.
    """

    output_dir: str = "outputs/run"
    max_steps: int = -1
    num_train_epochs: float = 1.0
    max_minutes: float = 0.0
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-5
    lr_scheduler: str = "linear"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 0.0
    wsd_decay_ratio: float = 0.1
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = 1.0
    amp: str | None = None
    device: str = "auto"
    compile: bool = False
    recompute: str = "none"
    seed: int = 42
    logging_steps: int = 10
    eval_steps: int = 0
    save_steps: int = 500
    save_total_limit: int | None = None
    resume_from_checkpoint: str | None = None
    dataloader_num_workers: int = 0
    group_by_length: bool = False
    prefetch_factor: int = 2
    max_nonfinite_steps: int = 5
    deterministic: bool = False
    peak_flops: float | None = None
    overwrite_output_dir: bool = False
    tensorboard: bool = True
    progress_bar: bool = True
    strategy: dict | None = None

    def __post_init__(self) -> None:
        self._check_types()

        def need(condition: bool, field: str, rule: str) -> None:
            if not condition:
                raise ValueError(f"TrainingArguments.{field} {rule}, got {getattr(self, field)!r}")

        need(bool(self.output_dir), "output_dir", "must be a non-empty path")
        need(self.max_steps == -1 or self.max_steps > 0, "max_steps", "must be > 0, or -1 to use num_train_epochs")
        need(self.num_train_epochs > 0, "num_train_epochs", "must be > 0")
        need(self.max_minutes >= 0, "max_minutes", "must be >= 0 (0: no budget)")
        need(not (self.max_minutes and self.strategy is not None), "max_minutes",
             "is not supported with a strategy (each rank's clock would stop it at a different step); set it to 0")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                     "logging_steps", "max_nonfinite_steps"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) > 0, name, "must be an integer > 0")
        for name in ("warmup_steps", "eval_steps", "save_steps", "dataloader_num_workers"):
            need(isinstance(getattr(self, name), int) and getattr(self, name) >= 0, name, "must be an integer >= 0")
        need(self.prefetch_factor >= 1, "prefetch_factor", "must be >= 1")
        need(self.learning_rate > 0, "learning_rate", "must be > 0")
        need(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio", "must be a fraction of the steps in [0, 1)")
        need(0.0 <= self.min_lr_ratio <= 1.0, "min_lr_ratio", "must be in [0, 1]")
        need(0.0 < self.wsd_decay_ratio <= 1.0, "wsd_decay_ratio", "must be in (0, 1]")
        need(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        need(0.0 <= self.adam_beta1 < 1.0, "adam_beta1", "must be in [0, 1)")
        need(0.0 <= self.adam_beta2 < 1.0, "adam_beta2", "must be in [0, 1)")
        need(self.adam_epsilon > 0, "adam_epsilon", "must be > 0")
        need(self.max_grad_norm >= 0, "max_grad_norm", "must be >= 0 (0 disables clipping)")
        need(self.lr_scheduler in LR_SCHEDULERS, "lr_scheduler", f"must be one of {list(LR_SCHEDULERS)}")
        if self.amp in ("none", ""):
            self.amp = None
        need(self.amp in AMP_MODES, "amp", f"must be one of {list(AMP_MODES)}")
        from sampan.utils.device import check_device_spec

        self.device = check_device_spec(self.device)
        need(self.recompute in RECOMPUTE_MODES, "recompute", f"must be one of {list(RECOMPUTE_MODES)}")
        need(self.save_total_limit is None or self.save_total_limit > 0, "save_total_limit",
             "must be > 0 or None (keep all)")
        need(self.peak_flops is None or self.peak_flops >= 0, "peak_flops", "must be >= 0, or None (the device's own peak)")
        if self.strategy is not None:
            from sampan.distributed.strategy import DistributedStrategy  # plain data: starts nothing

            # Validate now (unknown keys, bad degrees), before any process group exists; keep the dict.
            self.strategy = DistributedStrategy.from_dict(self.strategy).to_dict()

    def _check_types(self) -> None:
        """Each field must hold its annotated type (ints may stand for floats; bools never for numbers)."""
        kinds = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "None": (type(None),),
                 "dict": (dict,)}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            allowed = tuple(t for part in str(field.type).split("|") for t in kinds[part.strip()])
            ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
            if not ok:
                raise ValueError(f"TrainingArguments.{field.name} must be {field.type}, got {value!r} "
                                 f"({type(value).__name__})")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingArguments:
        """Build from a mapping; an unknown key is an error naming it and the allowed keys."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise ValueError(f"unknown training argument(s) {unknown}; allowed: {sorted(fields)}")
        return cls(**dict(data))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def warmup_for(self, max_steps: int) -> int:
        """Warmup steps of a run of ``max_steps``: ``warmup_steps``, else ``warmup_ratio`` of the run."""
        warmup = self.warmup_steps or math.ceil(self.warmup_ratio * max_steps)
        return min(warmup, max_steps)


# The short flags users expect on every training verb (``sampan pretrain --steps 300 --lr 3e-4``),
# beside the full ``--training.<field>`` ones the verbs generate from this class.
TRAINING_ALIASES: dict[str, tuple[str, ...]] = {
    "training.max_steps": ("--steps", "--max-steps"),
    "training.learning_rate": ("--learning-rate", "--lr"),
    "training.per_device_train_batch_size": ("--batch-size",),
    "training.output_dir": ("--output-dir",),
    "training.warmup_steps": ("--warmup-steps",),
    "training.seed": ("--seed",),
    "training.device": ("--device",),
    "training.amp": ("--amp",),
    "training.compile": ("--compile",),
    "training.logging_steps": ("--logging-steps",),
    "training.eval_steps": ("--eval-steps",),
    "training.save_steps": ("--save-steps",),
    "training.overwrite_output_dir": ("--overwrite",),
}
# ``--resume``: continue the run in output_dir from its newest valid checkpoint.
RESUME_FLAG = {"--resume": ("training.resume_from_checkpoint", "auto",
                            "continue the run in the output directory from its newest valid checkpoint (the "
                            "same as --training.resume_from_checkpoint auto)")}

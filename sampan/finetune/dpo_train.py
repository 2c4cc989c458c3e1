"""``run_dpo(cfg)``: preference tuning of a causal LM (``sampan finetune --task dpo``).

preference records -> chat-template token ids (``dpo_data``) -> a base causal LM with its method
(``causal_lm``: full, LoRA or adapters) -> the Trainer with DPO's loss (``dpo_loss``) -> dev
reward accuracy and margins -> the output directory ``causal_lm.save_causal_lm`` writes.

The reference is what ``DPOConfig.reference`` says: "model" keeps the starting weights (with LoRA
the policy itself with its low-rank updates switched off, so nothing is copied; otherwise a frozen
copy), "precomputed" reads them from the records. Training runs through ``sampan.trainer.Trainer``
(progress, ``training/metrics.jsonl`` with the DPO metrics beside the loss, checkpoints every
``save_steps``, ``resume_from_checkpoint``), its loss hook replaced by DPO's.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sampan.finetune.causal_lm import (
    BAD_RECORDS_FILE,
    apply_causal_method,
    load_causal_lm,
    method_args,
    prepare_output_dir,
    save_causal_lm,
)
from sampan.finetune.chat_data import BadRecords
from sampan.finetune.config import FinetuneConfig
from sampan.finetune.dpo_config import DPOConfig
from sampan.finetune.dpo_data import PreferenceCollator, PreferenceDataset, PreferencePair, preference_splits
from sampan.finetune.dpo_loss import Reference, batch_loss
from sampan.finetune.peft_format import without_lora
from sampan.finetune.result import FinetuneResult
from sampan.trainer import Trainer, TrainerCallback
from sampan.trainer.arguments import TrainingArguments
from sampan.trainer.backend import to_device
from sampan.utils.device import resolve_device

TRAINING_DIR = "training"  # the Trainer's run (metrics.jsonl, checkpoints) inside the output directory


class DPOTrainer(Trainer):
    """The Trainer with DPO's loss: each batch is ``PreferenceCollator``'s (chosen rows, then
    rejected rows), scored by the policy (with gradients) and by ``reference``.

    The DPO metrics of the training batches (``rewards/accuracies``, ``rewards/margins`` ...) are
    averaged over each logging window and written beside the loss (metrics.jsonl, TensorBoard).
    """

    def __init__(self, model: nn.Module, args: TrainingArguments, train_dataset, reference: Reference,
                 dpo: DPOConfig, data_collator=None, callbacks: list[TrainerCallback] | None = None):
        refuse_strategy(args)
        super().__init__(model, args, train_dataset, data_collator=data_collator, callbacks=callbacks)
        self.reference, self.dpo = reference, dpo
        if reference.model is not None:
            reference.model.to(self.device)
        self.window: dict[str, list[float]] = defaultdict(list)
        # First, so the metrics are in the record before metrics.jsonl / TensorBoard / the console see it.
        self.callbacks.insert(0, _WindowMetrics(self.window))

    def compute_loss(self, model: nn.Module, batch: Any) -> torch.Tensor:
        out = batch_loss(model, self.reference, batch, self.dpo)
        if model.training:
            for name, value in out.metrics.items():
                self.window[name].append(value)
        return out.loss


def refuse_strategy(args: TrainingArguments) -> None:
    """DPO trains in one process: with a strategy the fleet backend runs the model's own
    ``forward_backward`` (pipeline schedules included) and never calls a loss hook."""
    if args.strategy is not None:
        raise ValueError("DPO runs in one process for now: its loss needs the reference's log-probabilities beside "
                         "the policy's, and a hybrid-parallel run computes its loss inside the model's own "
                         "forward_backward; drop training.strategy")


class _WindowMetrics(TrainerCallback):
    """Adds the mean DPO metrics of the steps since the last log line to that line."""

    def __init__(self, window: dict[str, list[float]]):
        self.window = window

    def on_log(self, args, state, metrics):
        metrics.update({name: sum(values) / len(values) for name, values in self.window.items() if values})
        self.window.clear()


@torch.no_grad()
def evaluate_pairs(model: nn.Module, reference: Reference, pairs: list[PreferencePair], collator: PreferenceCollator,
                   dpo: DPOConfig, batch_size: int, device: torch.device | str = "cpu") -> dict[str, float]:
    """Mean DPO ``loss`` and metrics (``rewards/accuracies``, ``rewards/margins`` ...) over ``pairs``,
    the model in eval mode (each batch weighted by its pairs)."""
    if not pairs:
        return {}
    was_training = model.training
    model.eval()
    totals: dict[str, float] = defaultdict(float)
    try:
        for start in range(0, len(pairs), batch_size):
            chunk = pairs[start:start + batch_size]
            out = batch_loss(model, reference, to_device(collator(chunk), device), dpo)
            totals["loss"] += out.loss.item() * len(chunk)
            for name, value in out.metrics.items():
                totals[name] += value * len(chunk)
    finally:
        model.train(was_training)
    return {name: value / len(pairs) for name, value in totals.items()}


class _DevReport(TrainerCallback):
    """Scores the dev pairs every ``eval_steps`` and at the last step, and reports the figures
    through the Trainer's other callbacks (metrics.jsonl, TensorBoard, console)."""

    def __init__(self, evaluate, eval_steps: int):
        self.evaluate, self.eval_steps = evaluate, eval_steps
        self.trainer: Trainer | None = None
        self.last: dict[str, Any] = {}

    def on_step_end(self, args, state):
        step = state.global_step
        if not (step == state.max_steps or (self.eval_steps and step % self.eval_steps == 0)):
            return
        self.last = {"step": step, **self.evaluate()}
        record = {"step": step, **{f"eval_{k}": v for k, v in self.last.items() if k != "step"}}
        for cb in self.trainer.callbacks:
            if cb is not self:
                cb.on_evaluate(args, state, record)


def _sample(pairs: list[PreferencePair], limit: int | None, seed: int) -> list[PreferencePair]:
    if limit is None or len(pairs) <= limit:
        return pairs
    return sorted(random.Random(seed).sample(pairs, limit), key=lambda p: (p.source, p.line))


def run_dpo(cfg: FinetuneConfig, callbacks: list[TrainerCallback] | None = None) -> FinetuneResult:
    """Preference-tune ``cfg.model`` on ``cfg.data`` (``cfg.task == "dpo"``) and write the model to
    ``cfg.training.output_dir``; returns a ``FinetuneResult`` whose ``metrics`` are the dev split's
    DPO figures after training and ``initial_dev_metrics`` the same before the first step.

    ``cfg`` is a ``FinetuneConfig``: ``dpo`` (beta, loss, reference), ``chat`` (the template,
    the system prompt, ``max_bad``), the method and its settings, ``max_length`` (prompt +
    completion), ``dev_fraction`` and ``training`` (``per_device_train_batch_size`` counts pairs).
    """
    if cfg.task != "dpo":
        raise ValueError(f"run_dpo runs task='dpo', got task={cfg.task!r}")
    training, dpo = cfg.training, cfg.dpo
    refuse_strategy(training)  # before any loading
    resolve_device(training.device)  # a GPU that is not there fails now, not after the data is read
    out = Path(training.output_dir)
    prepare_output_dir(out, training.overwrite_output_dir, training.resume_from_checkpoint is not None)
    base = load_causal_lm(cfg.model, chat_template=cfg.chat.chat_template)
    bad = BadRecords(cfg.chat.max_bad)
    train, dev = preference_splits(cfg.data, base.tokenizer, dpo, cfg.max_length, cfg.dev_fraction, training.seed,
                                   bad, cfg.chat.system_prompt)
    print(bad.summary())
    bad.write(out / BAD_RECORDS_FILE)
    train = _sample(train, cfg.max_train_examples, training.seed)
    dev = _sample(dev, cfg.max_eval_examples, training.seed)

    # The reference: the starting weights. LoRA trains only its factors, so switching them off gives
    # the start back with no copy; full and adapter runs (norms train too) keep a frozen copy.
    if dpo.reference == "precomputed":
        reference = Reference()
    elif cfg.method == "lora":
        reference = Reference(disable=without_lora)
    else:
        reference = Reference(model=copy.deepcopy(base.model))
    torch.manual_seed(training.seed)  # LoRA / adapter init
    info = apply_causal_method(base.model, cfg.method, method_args(cfg), cfg.freeze)

    batch = training.per_device_train_batch_size
    if len(train) < batch:
        raise ValueError(f"only {len(train)} training pairs, fewer than one batch of {batch}; lower "
                         "training.per_device_train_batch_size (--batch-size) or give more data")
    steps = (training.max_steps if training.max_steps > 0
             else max(1, math.ceil(training.num_train_epochs * (len(train) // batch)
                                   / training.gradient_accumulation_steps)))
    args = dataclasses.replace(
        training, output_dir=str(out / TRAINING_DIR), max_steps=steps, per_device_eval_batch_size=batch,
        warmup_steps=training.warmup_for(steps), warmup_ratio=0.0, logging_steps=min(training.logging_steps, steps),
        eval_steps=0, overwrite_output_dir=True)
    pad = next((t for t in (base.tokenizer.pad_token_id, base.tokenizer.eos_token_id) if t is not None), 0)
    collator = PreferenceCollator(pad)
    report = _DevReport(lambda: evaluate_pairs(base.model, reference, dev, collator, dpo, batch, trainer.device),
                        training.eval_steps)
    trainer = DPOTrainer(base.model, args, PreferenceDataset(train), reference, dpo, data_collator=collator,
                         callbacks=[report, *(callbacks or [])])
    report.trainer = trainer
    initial = {"step": 0, **report.evaluate()} if dev and training.resume_from_checkpoint is None else {}
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start
    final = report.last or ({"step": steps, **report.evaluate()} if dev else {})
    metrics = {k: v for k, v in final.items() if k != "step"}
    sizes = {"train": len(train), "dev": len(dev), "bad": len(bad)}
    meta = {
        "task": "dpo", "base_model_name": cfg.model, "dpo": dataclasses.asdict(dpo), "max_length": cfg.max_length,
        "metrics": metrics, "initial_dev_metrics": initial, "data": cfg.data, "data_sizes": sizes, "steps": steps,
        "learning_rate": training.learning_rate, "batch_size": batch, "seed": training.seed,
        "bad_records": bad.counts(), "trainable_parameters": info.trainable_parameters,
        "total_parameters": info.total_parameters,
    }
    # After the last evaluation: saving merges LoRA into the weights, after which "LoRA off" is no reference.
    save_causal_lm(base, out, cfg.method, info.method_args, save=cfg.save, meta=meta)
    return FinetuneResult(out, metrics, final, info.trainable_parameters, info.total_parameters, train_seconds, [],
                          sizes, f"{base.family} causal LM from {base.directory}", initial)


__all__ = ["DPOTrainer", "evaluate_pairs", "refuse_strategy", "run_dpo"]

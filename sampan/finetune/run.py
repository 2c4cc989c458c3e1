"""``finetune(cfg)``: data -> base model -> method -> Trainer (dev selection) -> test metrics -> output dir."""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from sampan.finetune.augment import augment_ner
from sampan.finetune.base import build_task_model, load_base
from sampan.finetune.config import FinetuneConfig
from sampan.finetune.data import load_task_data
from sampan.finetune.encoding import EncodedDataset, PadCollator, encode_examples
from sampan.finetune.evaluate import (
    SELECTION_METRIC,
    choose_transitions,
    evaluate_examples,
    predict_logits,
    score,
)
from sampan.finetune.gazetteer import load_gazetteer
from sampan.finetune.result import FinetuneResult
from sampan.finetune.task_model import apply_method, save_task_model, trainable_state
from sampan.trainer import Trainer, TrainerCallback
from sampan.utils.device import resolve_device

TRAINING_DIR = "training"  # the Trainer's run (metrics.jsonl, TensorBoard) inside output_dir


class DevSelection(TrainerCallback):
    """Scores the dev split every ``eval_steps`` and at the last step, reports it through the
    Trainer's callbacks (metrics.jsonl, TensorBoard, console), and keeps the best trainable state."""

    def __init__(self, evaluate, metric: str, eval_steps: int):
        self.evaluate, self.metric, self.eval_steps = evaluate, metric, eval_steps
        self.trainer: Trainer | None = None
        self.best: dict[str, Any] | None = None
        self.best_state: dict[str, torch.Tensor] | None = None
        self.initial: dict[str, Any] = {}

    def on_train_begin(self, args, state):
        # The starting point, for the record (and to show training moved it); never selected.
        self.initial = {"step": state.global_step, **self.evaluate()}

    def on_step_end(self, args, state):
        step = state.global_step
        if not (step == state.max_steps or (self.eval_steps and step % self.eval_steps == 0)):
            return
        scores = self.evaluate()
        record = {"step": step, **{f"eval_{k}": v for k, v in scores.items()}}
        for cb in self.trainer.callbacks:
            if cb is not self:
                cb.on_evaluate(args, state, record)
        if self.best is None or scores[self.metric] > self.best[self.metric]:
            self.best = {"step": step, **scores}
            self.best_state = trainable_state(self.trainer.model)


def _prepare_output_dir(path: Path, overwrite: bool) -> None:
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            raise ValueError(f"output directory {path} is not empty; set training.overwrite_output_dir (--overwrite) "
                             "to replace it, or choose another training.output_dir (--output-dir)")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)


def finetune(cfg: FinetuneConfig, callbacks: list[TrainerCallback] | None = None) -> FinetuneResult:
    """Fine-tune ``cfg.model`` on ``cfg.task`` and write the model to ``cfg.training.output_dir``.

    task="chat" runs ``chat_sft.run_chat_sft`` and task="dpo" ``dpo_train.run_dpo`` (causal LMs,
    resumable); what follows is sentiment / ner on ERNIE.

    Training runs through ``sampan.trainer.Trainer`` (progress, ``training/metrics.jsonl``,
    TensorBoard under ``training/``); the dev split picks the best evaluation, whose weights are
    scored on the test split and saved. The Trainer's checkpoint is deleted once the model is
    written (the model directory is the product; the run is short).
    """
    if not isinstance(cfg, FinetuneConfig):
        raise TypeError("finetune() takes a sampan.finetune.FinetuneConfig")
    if cfg.task == "chat":  # a causal LM on conversations (sampan/finetune/chat_sft.py)
        from sampan.finetune.chat_sft import run_chat_sft

        return run_chat_sft(cfg, callbacks)
    if cfg.task == "dpo":  # preference tuning of a causal LM (sampan/finetune/dpo_train.py)
        from sampan.finetune.dpo_train import run_dpo

        return run_dpo(cfg, callbacks)
    if cfg.task == "ocr_rec":  # a CTC line recogniser on labelled line images (sampan/finetune/ocr_rec.py)
        from sampan.finetune.ocr_rec import run_ocr_rec

        return run_ocr_rec(cfg, callbacks)
    if cfg.task == "detection":  # an anchor-free detector on a COCO file (sampan/finetune/detection.py)
        from sampan.finetune.detection import run_detection

        return run_detection(cfg, callbacks)
    training = cfg.training
    resolve_device(training.device)  # a GPU that is not there fails now, not after the data is loaded
    out = Path(training.output_dir)
    _prepare_output_dir(out, training.overwrite_output_dir)
    data = load_task_data(cfg.task, cfg.data, cfg.max_length, cfg.dev_fraction, training.seed,
                          cfg.max_train_examples, cfg.max_eval_examples, cfg.silver_corpora,
                          cfg.silver_max_sentences)
    base = load_base(cfg.model, [ex.text for ex in data.train], cfg.tokenizer_vocab_size)
    originals = len(data.train)  # the tag-bigram prior is counted on these, not on augmented copies
    if cfg.augment_mentions:  # after load_base: a tokenizer trained here sees the real sentences only
        names = load_gazetteer(cfg.augment_gazetteer, data.entity_types)
        if names:
            print("gazetteer: " + ", ".join(f"{len(v):,} {k}" for k, v in sorted(names.items())) + " outside names")
        extra = augment_ner(data.train, cfg.augment_mentions, cfg.max_length - 2, training.seed,
                            [ex.text for ex in data.dev + data.test], cfg.augment_types, names)
        print(f"mention replacement: {len(extra):,} augmented training sentences beside {len(data.train):,}")
        data.train.extend(extra)
    if cfg.save == "adapter" and base.directory is None:
        raise ValueError("save='adapter' needs a base model directory (the adapter points at it); "
                         f"{cfg.model!r} is a config name with random weights: use save='merged'")
    overrides = cfg.config_overrides()
    model, report = build_task_model(base, cfg.task, len(data.labels), training.seed, cfg.max_length, overrides)
    print(f"base {cfg.model}: {report}")
    method_args = {"lora_rank": cfg.lora_rank, "lora_alpha": cfg.lora_alpha, "lora_dropout": cfg.lora_dropout,
                   "lora_targets": list(cfg.lora_targets)} if cfg.method == "lora" else (
        {"adapter_size": cfg.adapter_size} if cfg.method == "adapter" else {})
    if cfg.embedding_lora_rank:
        method_args.update(embedding_lora_rank=cfg.embedding_lora_rank, embedding_lora_alpha=cfg.embedding_lora_alpha)
    torch.manual_seed(training.seed)  # LoRA / adapter init
    apply_method(model, cfg.method, method_args, report.initialised, cfg.freeze)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())

    encode = {name: encode_examples(base.tokenizer, getattr(data, name), cfg.task, data.labels, cfg.max_length)
              for name in ("train", "dev", "test")}
    collator = PadCollator(base.features, base.feature_names)
    batch = training.per_device_train_batch_size
    if len(encode["train"]) < batch:
        raise ValueError(f"only {len(encode['train'])} training examples, fewer than one batch of {batch}; "
                         "lower training.per_device_train_batch_size (--batch-size) or give more data")
    steps = (training.max_steps if training.max_steps > 0
             else max(1, math.ceil(training.num_train_epochs * (len(encode["train"]) // batch))))
    # The Trainer's run lives under the model directory; dev selection (below) evaluates, not the Trainer.
    args = dataclasses.replace(
        training, output_dir=str(out / TRAINING_DIR), max_steps=steps, per_device_eval_batch_size=batch,
        warmup_steps=training.warmup_for(steps), warmup_ratio=0.0, logging_steps=min(training.logging_steps, steps),
        eval_steps=0, overwrite_output_dir=True)
    metric = SELECTION_METRIC[cfg.task]
    selection = DevSelection(
        lambda: evaluate_examples(model, cfg.task, data.dev, encode["dev"], data.labels, collator),
        metric, training.eval_steps)
    trainer = Trainer(model, args, EncodedDataset(encode["train"]), data_collator=collator,
                      callbacks=[selection, *(callbacks or [])])
    selection.trainer = trainer
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, tensor in selection.best_state.items():
            params[name].copy_(tensor)
    dev_metrics, transitions, search = dict(selection.best), None, {}
    if cfg.task == "ner" and cfg.tag_transitions:
        transitions, search = choose_transitions(model, encode["train"][:originals], data.dev, encode["dev"],
                                                 data.labels, collator)
        dev_metrics.update(search[transitions.weight])  # the dev figures as the model will decode
        print("tag-bigram prior, dev F1 by weight: " + ", ".join(f"{w:g}: {m['f1']:.4f}" for w, m in search.items())
              + f" -> weight {transitions.weight:g}")
    logits, loss = predict_logits(model, encode["test"], collator)
    test = {"loss": loss, **score(cfg.task, data.test, encode["test"], logits, data.labels, transitions)}
    without = ({"loss": loss, **score(cfg.task, data.test, encode["test"], logits, data.labels)}
               if transitions is not None else {})
    for checkpoint in (out / TRAINING_DIR).glob("checkpoint-*"):
        shutil.rmtree(checkpoint)
    meta = {
        "task": cfg.task, "labels": data.labels, "max_length": cfg.max_length, "base_model": cfg.model,
        "method": cfg.method, "method_args": method_args, "freeze": list(cfg.freeze), "metrics": test, "dev_metrics": dev_metrics,
        "trainable_parameters": trainable, "total_parameters": total, "seed": training.seed,
        "features": list(base.feature_names), "data": cfg.data, "data_sizes": data.sizes(),
        "steps": steps, "learning_rate": training.learning_rate, "batch_size": batch,
        "augment_mentions": cfg.augment_mentions, "augment_types": list(cfg.augment_types),
        "augment_gazetteer": list(cfg.augment_gazetteer),
        "config_overrides": overrides,
    }
    if transitions is not None:
        meta["tag_transitions"] = transitions.to_dict()
        meta["tag_transition_search"] = {f"{w:g}": round(m["f1"], 6) for w, m in search.items()}
        meta["metrics_without_transitions"] = without
    save_task_model(model, out, meta, base, cfg.save)
    return FinetuneResult(out, test, dev_metrics, trainable, total, train_seconds, data.labels, data.sizes(),
                          str(report), selection.initial, without)

"""Supervised fine-tuning for chat: ``run_chat_sft(cfg)``, what ``finetune`` runs for task="chat".

The steps, each owned by its module: read the JSONL conversations (``chat_data``: bad records
counted with their line numbers, ``max_bad``), load the causal LM and its tokenizer
(``causal_lm``), render and label each conversation with the model's chat template
(``chat_encoding``: loss on assistant tokens only), pack them into rows (``packing``: attention
kept inside each conversation) or pad them, apply full / LoRA / adapter, train through the
``Trainer`` (checkpoints every ``save_steps``, ``--resume``, a fleet ``strategy``), score the dev
loss before and after, and save (``causal_lm.save_causal_lm``: a Hugging Face directory with
the tokenizer and its chat template, plus a peft adapter for LoRA).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import time
import types
from pathlib import Path
from typing import Any

import torch

from sampan.finetune.causal_lm import (
    BAD_RECORDS_FILE,
    apply_causal_method,
    load_causal_lm,
    method_args,
    prepare_output_dir,
    save_causal_lm,
)
from sampan.finetune.chat_data import BadRecords, load_chat_data
from sampan.finetune.chat_encoding import ChatEncoder, encode_records
from sampan.finetune.config import FinetuneConfig
from sampan.finetune.packing import ChatCollator, PackedDataset, PaddedDataset
from sampan.finetune.result import FinetuneResult
from sampan.trainer import Trainer, TrainerCallback
from sampan.utils.device import resolve_device

TRAINING_DIR = "training"  # the Trainer's run (checkpoints, metrics.jsonl, TensorBoard) inside output_dir


class DevLoss(TrainerCallback):
    """Scores the dev loss before the first step (a fresh run only) and keeps the Trainer's
    evaluations (every ``eval_steps`` and at the end) for the result."""

    def __init__(self):
        self.trainer: Trainer | None = None
        self.initial: dict[str, Any] = {}
        self.last: dict[str, Any] = {}

    def on_train_begin(self, args, state):
        if state.global_step == 0 and self.trainer is not None and self.trainer.eval_dataset is not None:
            self.initial = dict(self.trainer.evaluate())

    def on_evaluate(self, args, state, metrics):
        self.last = dict(metrics)


def _takes_segments(model: torch.nn.Module) -> bool:
    return "segment_ids" in inspect.signature(model.forward).parameters


def _save_from_fleet(cfg: FinetuneConfig, trainer: Trainer, out: Path, meta: dict[str, Any]) -> None:
    """On a fleet layout the trained weights are split over the ranks: rank 0 rebuilds the model
    (base + the same method) and loads the run's last checkpoint into it, which holds every slice,
    then saves it as a run in one process would; the other ranks wait."""
    from sampan.checkpoint.discovery import checkpoint_dir_name
    from sampan.distributed.checkpoint import load_distributed

    if trainer.backend.is_main:
        whole = load_causal_lm(cfg.model, cfg.chat.chat_template)
        info = apply_causal_method(whole.model, cfg.method, method_args(cfg), cfg.freeze)
        checkpoint = Path(trainer.args.output_dir) / checkpoint_dir_name(trainer.state.global_step)
        # load_distributed reads a fleet model's ``.model``; a bare Llama's ``.model`` is its
        # decoder, so hand it the whole causal LM under that name.
        load_distributed(checkpoint, types.SimpleNamespace(model=whole.model), no_dist=True)
        save_causal_lm(whole, out, cfg.method, info.method_args, cfg.save, meta)
    trainer.backend.barrier()


def _ranks(strategy: dict | None) -> tuple[int, int]:
    """``(ranks, data-parallel ranks)`` of this run: the world size under a launcher, and the ranks
    that see different batches (data parallel x sharding, each rank a share of an epoch)."""
    if strategy is None:
        return 1, 1
    from sampan.distributed.strategy import DistributedStrategy

    world = int(os.environ.get("WORLD_SIZE", "1"))
    degrees = DistributedStrategy.from_dict(strategy).resolve_degrees(world)
    return world, max(1, degrees["dp"] * degrees["sharding"])


def run_chat_sft(cfg: FinetuneConfig, callbacks: list[TrainerCallback] | None = None):
    """Fine-tune ``cfg.model`` on ``cfg.data``'s conversations; returns a ``FinetuneResult`` whose
    ``metrics`` hold the final dev ``loss`` and ``initial_dev_metrics`` the loss before training."""
    if cfg.task != "chat":
        raise ValueError(f"run_chat_sft runs task='chat', not {cfg.task!r}")
    training, chat = cfg.training, cfg.chat
    resolve_device(training.device)
    out = Path(training.output_dir)
    resuming = training.resume_from_checkpoint is not None
    from sampan.distributed.env import rank

    # Under a launcher every rank runs this far before the process group exists: only rank 0 may
    # check, clear and fill the directory (another rank would find rank 0's files and refuse, or
    # delete them); the rest only make sure it exists.
    main = rank() == 0
    if main:
        prepare_output_dir(out, training.overwrite_output_dir, resuming)
    else:
        out.mkdir(parents=True, exist_ok=True)

    bad = BadRecords(chat.max_bad)
    data = load_chat_data(cfg.data, bad, cfg.dev_fraction, training.seed, cfg.max_train_examples,
                          cfg.max_eval_examples)
    base = load_causal_lm(cfg.model, chat.chat_template)
    encoder = ChatEncoder(base.tokenizer, cfg.max_length, chat.system_prompt)
    train = encode_records(data.train, encoder, bad)
    dev = encode_records(data.dev, encoder, bad)
    print(bad.summary())
    if main:
        bad.write(out / BAD_RECORDS_FILE)
    if not train:
        raise ValueError(f"no training conversation left after the bad records; {bad.summary()}")

    torch.manual_seed(training.seed)  # LoRA / adapter init
    info = apply_causal_method(base.model, cfg.method, method_args(cfg), cfg.freeze)
    if chat.packing and not _takes_segments(base.model):
        raise ValueError(f"{type(base.model).__name__} takes no segment_ids, so it cannot attend within packed "
                         "conversations only; set chat.packing false (--no-packing)")
    make = (lambda seqs: PackedDataset(seqs, cfg.max_length)) if chat.packing else PaddedDataset
    train_set = make(train)
    dev_set = make(dev) if dev else None
    pad_id = base.tokenizer.pad_token_id if base.tokenizer.pad_token_id is not None else 0
    # With a strategy the micro-batches of a step are concatenated: give them all one length.
    collator = ChatCollator(pad_id, pad_to=cfg.max_length if training.strategy is not None else None)
    batch = training.per_device_train_batch_size
    ranks, data_ranks = _ranks(training.strategy)
    if len(train_set) < batch:
        raise ValueError(f"only {len(train_set)} training rows ({len(train)} conversations"
                         f"{', packed' if chat.packing else ''}), fewer than one batch of {batch}; lower "
                         "training.per_device_train_batch_size (--batch-size) or give more data")
    steps = (training.max_steps if training.max_steps > 0
             else max(1, math.ceil(training.num_train_epochs * (len(train_set) // (batch * data_ranks))
                                   / training.gradient_accumulation_steps)))
    # A small dev split still gets scored: the eval batch shrinks to fit it over the ranks.
    if dev_set is not None and len(dev_set) < ranks:
        print(f"dev split: {len(dev_set)} rows for {ranks} ranks, too few to score; no dev loss")
        dev_set = None
    eval_batch = max(1, min(training.per_device_eval_batch_size, len(dev_set) // ranks)) if dev_set else 1
    args = dataclasses.replace(
        training, output_dir=str(out / TRAINING_DIR), max_steps=steps, per_device_eval_batch_size=eval_batch,
        warmup_steps=training.warmup_for(steps), warmup_ratio=0.0, logging_steps=min(training.logging_steps, steps),
        overwrite_output_dir=True)
    scores = DevLoss()
    trainer = Trainer(base.model, args, train_set, eval_dataset=dev_set, data_collator=collator,
                      callbacks=[scores, *(callbacks or [])])
    scores.trainer = trainer
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start

    dev_metrics = {"loss": scores.last["eval_loss"], "step": scores.last.get("step", steps)} if scores.last else {}
    initial = {"loss": scores.initial["eval_loss"]} if scores.initial else {}
    sizes = {**data.sizes(), "train_conversations": len(train), "dev_conversations": len(dev), "bad": len(bad),
             "train_rows": len(train_set), "train_tokens": sum(len(s) for s in train),
             "assistant_tokens": sum(s.assistant_tokens for s in train)}
    meta = {"task": "chat", "base_model_name": cfg.model, "max_length": cfg.max_length, "packing": chat.packing,
            "system_prompt": chat.system_prompt, "data": cfg.data, "data_sizes": sizes, "steps": steps,
            "learning_rate": training.learning_rate, "batch_size": batch, "seed": training.seed,
            "metrics": dev_metrics, "initial_dev_metrics": initial, "bad_records": bad.counts(),
            "trainable_parameters": info.trainable_parameters, "total_parameters": info.total_parameters}
    if training.strategy is None:
        save_causal_lm(base, out, cfg.method, info.method_args, cfg.save, meta)
    else:
        _save_from_fleet(cfg, trainer, out, meta)
    fill = f", rows {train_set.fill():.0%} full" if chat.packing else ""
    report = (f"{base.family} causal LM from {base.directory}; {len(train)} conversations in {len(train_set)} rows"
              f"{fill}; {cfg.method}: {info.trainable_parameters:,} of {info.total_parameters:,} parameters train")
    return FinetuneResult(out, dev_metrics, dev_metrics, info.trainable_parameters, info.total_parameters,
                          train_seconds, [], sizes, report, initial)

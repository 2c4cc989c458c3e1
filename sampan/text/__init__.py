"""Chinese text: corpora that ship inside packages, and vocabularies."""

from sampan.text.char_vocab import CharVocab
from sampan.text.corpus import package_file, sanguo_chapters

__all__ = ["CharVocab", "package_file", "sanguo_chapters"]

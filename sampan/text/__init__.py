"""Chinese text: corpora that ship inside packages, the tokenizer, knowledge masking, character features.

See docs/text.md. ``sampan data build`` turns corpora into token shards with span flags;
``sampan.pretraining`` trains ERNIE on them.
"""

from sampan.text.char_vocab import CharVocab
from sampan.text.chat_template import ChatTemplateError
from sampan.text.corpus import CORPORA, Document, load_corpus, package_file, sanguo_chapters
from sampan.text.features import CharFeatures
from sampan.text.masking import KnowledgeMasker, MaskingConfig, MaskingSchedule
from sampan.text.pretrained_tokenizer import PretrainedTokenizer
from sampan.text.tokenizer import ChineseTokenizer

__all__ = [
    "CORPORA",
    "CharFeatures",
    "CharVocab",
    "ChatTemplateError",
    "ChineseTokenizer",
    "Document",
    "KnowledgeMasker",
    "MaskingConfig",
    "MaskingSchedule",
    "PretrainedTokenizer",
    "load_corpus",
    "package_file",
    "sanguo_chapters",
]

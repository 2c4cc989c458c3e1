"""A BERT-Chinese style tokenizer, trained with Hugging Face ``tokenizers`` on sampan's corpora.

Each CJK character is its own token, Latin letters and digits are split into WordPiece units
(``iphone`` -> ``i ##p ##h ##one``), and text is NFKC-normalised first, so full-width letters,
digits and punctuation (``ＡＢＣ１９９８，：``) become their half-width forms; letters are
lower-cased. Offsets always point into the *original* text (the normaliser tracks alignment),
which is how knowledge-masking spans found on characters are carried onto tokens.

::

    tok = ChineseTokenizer.train(texts, vocab_size=8000)
    tok.save("tokenizer.json")
    tok = ChineseTokenizer.load("tokenizer.json")
    enc = tok.encode("江泽民在１９９８年说")      # enc.ids, enc.tokens, enc.offsets
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import (
    Encoding,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
CONTINUATION = "##"

# The WordPiece decoder joins every token with a space; between CJK characters (and around CJK
# punctuation) Chinese has none, so those spaces are removed again.
_CJK = r"\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_SPACE_NEAR_CJK = re.compile(rf"(?<=[{_CJK}]) (?=\S)|(?<=\S) (?=[{_CJK}])")


def _build_tokenizer(vocab: dict[str, int] | None = None) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", continuing_subword_prefix=CONTINUATION,
                                     max_input_chars_per_word=100))
    tok.normalizer = normalizers.Sequence([
        normalizers.NFKC(),
        # handle_chinese_chars puts spaces around every CJK character, so each becomes a word.
        normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=True),
    ])
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix=CONTINUATION)
    return tok


class ChineseTokenizer:
    """Wraps a ``tokenizers.Tokenizer`` with sampan's special tokens at fixed ids.

    ``[PAD]`` 0, ``[UNK]`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4. ``encode`` adds
    ``[CLS] ... [SEP]`` unless ``add_special_tokens=False``.
    """

    pad_id, unk_id, cls_id, sep_id, mask_id = PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID

    def __init__(self, tokenizer: Tokenizer):
        for i, token in enumerate(SPECIAL_TOKENS):
            if tokenizer.token_to_id(token) != i:
                raise ValueError(f"tokenizer must hold {token} at id {i} (sampan's special-token layout); "
                                 "train it with ChineseTokenizer.train")
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", CLS_ID), ("[SEP]", SEP_ID)],
        )
        self._tok = tokenizer

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2) -> ChineseTokenizer:
        """Learn a WordPiece vocabulary of at most ``vocab_size`` tokens from ``texts``.

        Every character seen becomes a token (so no seen CJK character is ever ``[UNK]``);
        the rest of the budget goes to WordPiece merges of Latin letters and digits seen at
        least ``min_frequency`` times.
        """
        if vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
        if min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
        tok = _build_tokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                            special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix=CONTINUATION,
                                            show_progress=False)
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    # -- files ----------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer as Hugging Face ``tokenizer.json`` (atomically: temp file, then rename)."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(self._tok.to_str(pretty=True), encoding="utf-8")
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> ChineseTokenizer:
        """Read a tokenizer written by :meth:`save` (any HF tokenizer.json with sampan's special ids)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} not found; build one with `sampan data build`")
        try:
            tok = Tokenizer.from_str(path.read_text(encoding="utf-8"))
        except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
            raise ValueError(f"{path} is not a tokenizers JSON file: {err}") from err
        return cls(tok)

    # -- encoding -------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        """One text -> ``Encoding`` (``ids``, ``tokens``, ``offsets`` into ``text``)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens)

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[Encoding]:
        """Many texts at once (in parallel, in Rust)."""
        return self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` (normalised: half-width, lower-case), without spaces between CJK characters."""
        text = self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        return _SPACE_NEAR_CJK.sub("", text)

    # -- vocabulary -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def __len__(self) -> int:
        return self.vocab_size

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, index: int) -> str | None:
        return self._tok.id_to_token(int(index))

    def tokens(self) -> list[str]:
        """All tokens, by id."""
        vocab = self._tok.get_vocab()
        out = [""] * len(vocab)
        for token, i in vocab.items():
            out[i] = token
        return out

    def continuation_mask(self) -> np.ndarray:
        """``bool[vocab_size]``: True for WordPiece continuations (``##x``), which never start a word."""
        return np.array([t.startswith(CONTINUATION) for t in self.tokens()], dtype=bool)

    def special_mask(self) -> np.ndarray:
        """``bool[vocab_size]``: True for the special tokens."""
        mask = np.zeros(self.vocab_size, dtype=bool)
        mask[: len(SPECIAL_TOKENS)] = True
        return mask

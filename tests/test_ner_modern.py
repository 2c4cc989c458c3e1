"""NER on modern text (issue 39): People's Daily compound names, LAC silver sentences, the modern gold set.

Measured cost: about 2 s on this 2-core machine (LAC tags five short sentences; nothing trains).
"""

from __future__ import annotations

import json
import re
import unicodedata

import pytest

from sampan.finetune import FinetuneConfig
from sampan.finetune.data import MODERN_NER_FILE, TaskExample, load_modern_ner
from sampan.finetune.silver import select_silver
from sampan.text.corpus import ENTITY_LABELS
from sampan.text.corpus.peoples_daily import compound_spans, is_org_suffix, parse_tagged_line


def _entities(line: str, compounds: bool = True) -> list[tuple[str, str]]:
    doc = parse_tagged_line(line, "x", compounds)
    return [(doc.text[s:e], label) for s, e, label in doc.entities]


# -- compound names in People's Daily --------------------------------------------------------------
def test_place_followed_by_an_organisation_suffix_is_one_org():
    assert _entities("四川/ns  大学/n  教授/n  王/nr  明/nr") == [("四川大学", "ORG"), ("王明", "PER")]
    assert _entities("浙江/ns  大学/n") == [("浙江大学", "ORG")]
    # The old word-level reading is still there for comparisons.
    assert _entities("浙江/ns  大学/n", compounds=False) == [("浙江", "LOC")]
    # Nouns between the name and the suffix join it, up to the last suffix in the run.
    assert _entities("北京/ns  市委/n  宣传部/n  部长/n") == [("北京市委宣传部", "ORG")]
    assert _entities("华北/ns  电力/n  集团公司/n  成立/v") == [("华北电力集团公司", "ORG")]
    assert _entities("国务院/nt  办公厅/n  通知/n") == [("国务院办公厅", "ORG")]
    # An organisation suffix wins over a place suffix earlier in the run, which alone makes a LOC.
    assert _entities("西藏/ns  自治区/n  政府/n") == [("西藏自治区政府", "ORG")]
    assert _entities("西藏/ns  自治区/n  的/u  牧民/n") == [("西藏自治区", "LOC")]


def test_a_place_without_a_suffix_stays_a_place():
    assert _entities("浙江/ns  风景/n  优美/a") == [("浙江", "LOC")]
    assert _entities("中国/ns  特色/n  社会主义/n") == [("中国", "LOC")]
    # Ordinary words that end like an organisation are not suffixes (干部 is not a 部).
    assert _entities("北京/ns  干部/n  和/c  群众/n") == [("北京", "LOC")]
    assert not is_org_suffix("干部") and not is_org_suffix("当局") and is_org_suffix("宣传部")
    # A verb ends the run: the rule does not reach over 驻 to 大使馆.
    assert _entities("中国/ns  驻/v  美国/ns  大使馆/n") == [("中国", "LOC"), ("美国大使馆", "ORG")]
    # Ranges are word indices; a compound needs two words at least.
    assert compound_spans(["四川", "大学"], ["ns", "n"]) == [(0, 2, "ORG")]
    assert compound_spans(["大学"], ["n"]) == []


# -- silver sentences ------------------------------------------------------------------------------
def test_silver_keeps_lac_entities_and_caps_the_entity_free_sentences():
    texts = ["腾讯公司在深圳发布了新的游戏。", "这件衣服质量很好，下次还会再买。", "张明去上海出差了三天。",
             "物流太慢了，等了一个星期。", "包装很一般，没有说明书。"]
    pool = [TaskExample(f"r{k}", t) for k, t in enumerate(texts)]
    kept, report = select_silver(pool, max_sentences=3, seed=0, entity_free_share=0.34)
    assert len(kept) == 3 and report.entity_free == 1 and report.with_entities == 2
    found = {ex.text: {(ex.text[s:e], t) for s, e, t in ex.entities} for ex in kept}
    assert ("深圳", "LOC") in found["腾讯公司在深圳发布了新的游戏。"]
    assert ("张明", "PER") in found["张明去上海出差了三天。"]
    assert sum(not ex.entities for ex in kept) == 1
    for ex in kept:
        assert all(0 <= s < e <= len(ex.text) and t in ENTITY_LABELS for s, e, t in ex.entities)
    with pytest.raises(ValueError, match="max_sentences"):
        select_silver(pool, max_sentences=0)


def test_silver_corpora_are_refused_outside_ner():
    with pytest.raises(ValueError, match="silver_corpora"):
        FinetuneConfig(task="sentiment_analysis", silver_corpora="reviews")
    assert FinetuneConfig(task="ner", silver_corpora="reviews,news").silver_corpora == ("reviews", "news")


# -- the modern gold set ---------------------------------------------------------------------------
def _marked_source() -> list[tuple[str, str, list[list]]]:
    rows = []
    for line in (MODERN_NER_FILE.parent / "ner_modern_marked.txt").read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        register, marked = line.split("\t")
        text, spans = "", []
        for m in re.finditer(r"\{([^{}|]+)\|([A-Z]+)\}|([^{}]+)", marked):
            if m.group(3) is not None:
                text += m.group(3)
            else:
                spans.append([len(text), len(text) + len(m.group(1)), m.group(2)])
                text += m.group(1)
        rows.append((register, text, spans))
    return rows


def test_modern_gold_set_offsets_types_and_source_agree():
    examples = load_modern_ner()
    rows = [json.loads(line) for line in MODERN_NER_FILE.read_text(encoding="utf-8").splitlines()]
    assert len(examples) == len(rows) >= 200
    assert len({ex.id for ex in examples}) == len(examples) and len({ex.text for ex in examples}) == len(examples)
    # The JSONL is exactly the hand-marked source converted to offsets.
    assert [(r["register"], r["text"], r["entities"]) for r in rows] == _marked_source()
    counts = dict.fromkeys(ENTITY_LABELS, 0)
    for ex in examples:
        spans = sorted(ex.entities)
        for s, e, t in spans:
            assert 0 <= s < e <= len(ex.text) and t in ENTITY_LABELS, (ex.id, s, e, t)
            mention = ex.text[s:e]
            # No span starts or ends on a blank or a punctuation mark (a slipped offset would).
            for ch in (mention[0], mention[-1]):
                assert not ch.isspace() and not unicodedata.category(ch).startswith("P"), (ex.id, mention)
            counts[t] += 1
        for (_, e1, _), (s2, _, _) in zip(spans, spans[1:], strict=False):
            assert e1 <= s2, (ex.id, spans)  # flat spans: BIO tags cannot hold overlaps
    assert all(n >= 50 for n in counts.values()), counts
    assert sum(not ex.entities for ex in examples) >= 5  # sentences with nothing to find

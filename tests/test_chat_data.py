"""The Chinese instruction set (``sampan data build-chat``), the held-out chat metrics
(``sampan.finetune.chat_eval``), ``Taskflow("chat")`` and ``hub.Module(...).chat`` on a tiny model.

Cost: 35 s on 2 idle cores (measured): the session's ``poetry_corpus`` fixture, 10 s, shared with
every test that reads the Tang poems; the builds, which read People's Daily, the reviews, 三国演义
and the poems, 10 s; one ONNX export of a 1-layer Llama with its decode graphs and the replies, 14 s.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
import torch

from sampan.finetune.chat_eval import (
    entity_f1,
    evaluate_chat,
    generate_replies,
    in_form,
    parse_entities,
    poem_form_share,
    score,
    sentiment_accuracy,
    sentiment_of,
)
from sampan.text.chat_corpus import (
    PHRASINGS,
    POEM_FORMS,
    SENTIMENT_WORDS,
    TASKS,
    ChatDataConfig,
    build_chat_data,
    poem_form,
    read_records,
    save_chat_tokenizer,
)
from sampan.text.corpus import CORPORA, SPLIT_SEED, held_out


@pytest.fixture
def home(tmp_path, monkeypatch, poetry_corpus):
    """A private $SAMPAN_HOME holding the fetched Tang poems."""
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    shutil.copytree(poetry_corpus, tmp_path / "home" / "corpora" / poetry_corpus.name)
    return tmp_path / "home"


def _source_corpus(record_id: str) -> tuple[str, str]:
    """(corpus, document id) of a record's source."""
    source = record_id.split(":", 1)[1].split("@")[0]
    corpus = {"poem": "poetry", "entities": "news", "segmentation": "news", "sentiment": "reviews",
              "continuation": "sanguo"}[record_id.split(":", 1)[0]]
    return corpus, source


def _phrasing(record: dict) -> int:
    """Which of its task's phrasings a record's question is."""
    import re

    user = record["messages"][-2]["content"]
    for k, template in enumerate(PHRASINGS[record["task"]]):
        if re.fullmatch(re.sub(r"\\{\w+\\}", "(.+)", re.escape(template)), user, flags=re.S):
            return k
    raise AssertionError(f"{user!r} is none of the {record['task']} phrasings")


def _check_record(record: dict) -> None:
    messages = record["messages"]
    assert [m["role"] for m in messages][-2:] == ["user", "assistant"]
    assert [m["role"] for m in messages[:-2]] in ([], ["system"])
    assert all(isinstance(m["content"], str) and m["content"].strip() for m in messages)
    user, answer = messages[-2]["content"], messages[-1]["content"]
    task = record["task"]
    if task == "poem":
        meta = record["meta"]
        assert poem_form(answer) == (meta["lines"], meta["chars_per_line"])
        assert POEM_FORMS[(meta["lines"], meta["chars_per_line"])] == meta["form"] and meta["form"] in user
    elif task == "entities":
        # the answer names every label, and every name is in the sentence
        assert answer.startswith("人名：") and "；地名：" in answer and "；机构名：" in answer
        assert all(name in user for _, name in parse_entities(answer))
    elif task == "sentiment":
        assert answer == SENTIMENT_WORDS[record["meta"]["label"]]
    elif task == "segmentation":
        words = answer.split("/")
        assert len(words) >= 2 and all(words) and "".join(words) in user
    else:
        assert task == "continuation" and len(answer) >= 10


def test_build_chat_splits_are_stable_disjoint_and_cover_every_task(home, tmp_path):
    small = ChatDataConfig(out_dir=str(tmp_path / "a"), per_task=20, held_out_per_task=8, word_separator="/")
    manifest = build_chat_data(small)
    assert manifest["records"] == {"train": dict.fromkeys(TASKS, 20), "test": dict.fromkeys(TASKS, 8)}
    train, test = read_records(tmp_path / "a" / "train.jsonl"), read_records(tmp_path / "a" / "test.jsonl")
    assert Counter(r["task"] for r in train) == dict.fromkeys(TASKS, 20)
    for record in train + test:
        _check_record(record)
    # held-out records come from the corpora's held-out documents (never from pretraining's rows)
    for split, records in (("train", train), ("test", test)):
        for record in records:
            corpus, doc = _source_corpus(record["id"])
            assert held_out(doc, CORPORA[corpus].held_out, SPLIT_SEED) == (split == "test"), record["id"]
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert len({r["id"] for r in train}) == len(train)
    # several phrasings per task, and some records open with a system message
    assert all(len({_phrasing(r) for r in train if r["task"] == task}) >= 2 for task in TASKS)
    assert 0 < sum(r["messages"][0]["role"] == "system" for r in train) < len(train)

    # the same settings give the same bytes (and replace the earlier build in place)
    first = (tmp_path / "a" / "train.jsonl").read_bytes()
    build_chat_data(small)
    assert (tmp_path / "a" / "train.jsonl").read_bytes() == first
    # another seed and more records: other draws, but no record changes side
    other = ChatDataConfig(out_dir=str(tmp_path / "b"), per_task=40, held_out_per_task=16, sample_seed=1,
                           chat_tasks=("entities", "sentiment", "continuation"), system_share=0.0)
    build_chat_data(other)
    train2, test2 = read_records(tmp_path / "b" / "train.jsonl"), read_records(tmp_path / "b" / "test.jsonl")
    assert {r["task"] for r in train2} == {"entities", "sentiment", "continuation"}
    assert all(r["messages"][0]["role"] == "user" for r in train2 + test2)
    ids, ids2 = ({r["id"] for r in train}, {r["id"] for r in test}), ({r["id"] for r in train2}, {r["id"] for r in test2})
    assert not (ids[0] & ids2[1]) and not (ids[1] & ids2[0])
    assert ids2[0] != {i for i in ids[0] if i.split(":")[0] in {"entities", "sentiment", "continuation"}}


def test_build_chat_refuses_bad_arguments(home, tmp_path, monkeypatch, capsys):
    from sampan.cli import main

    for bad, match in (({"chat_tasks": ("poem", "bogus")}, "name each of"), ({"per_task": -1}, "per_task must be"),
                       ({"per_task": 0, "held_out_per_task": 0}, "nothing to build"),
                       ({"system_share": 1.5}, "system_share must be"), ({"word_separator": "\n"}, "word_separator"),
                       ({"chat_tasks": ()}, "at least one")):
        with pytest.raises(ValueError, match=match):
            ChatDataConfig(**bad)
    assert main(["data", "build-chat", "--out", str(tmp_path / "x"), "--tasks", "poem,bogus"]) == 2
    assert "tasks ['poem', 'bogus']: name each of" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    # a directory that is not an instruction set is never replaced
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(FileExistsError, match="not an instruction set"):
        build_chat_data(ChatDataConfig(out_dir=str(tmp_path / "taken"), per_task=1, held_out_per_task=1))
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["notes.txt"]
    # the poem task without the Tang poems names the fetch and the way around it; nothing is written
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "empty-home"))
    with pytest.raises(FileNotFoundError, match=r"sampan data fetch poetry.*--tasks entities,sentiment"):
        build_chat_data(ChatDataConfig(out_dir=str(tmp_path / "c"), chat_tasks=("poem", "entities", "sentiment")))
    assert not (tmp_path / "c").exists()
    # the verb: --help says what it builds; a run prints the counts
    with pytest.raises(SystemExit):
        main(["data", "build-chat", "--help"])
    assert "instruction set" in capsys.readouterr().out
    assert main(["data", "build-chat", "--out", str(tmp_path / "d"), "--per-task", "3", "--held-out-per-task", "2",
                 "--tasks", "sentiment,segmentation", "--seed", "5"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["records"] == {"train": {"sentiment": 3, "segmentation": 3},
                                  "test": {"sentiment": 2, "segmentation": 2}}
    seg = [r for r in read_records(tmp_path / "d" / "train.jsonl") if r["task"] == "segmentation"]
    assert all(" " in r["messages"][-1]["content"] for r in seg)  # the default separator is a space


def test_chat_metrics_on_hand_made_cases():
    gold = "人名：江泽民、李鹏；地名：北京；机构名：无"
    assert parse_entities(gold) == {("PER", "江泽民"), ("PER", "李鹏"), ("LOC", "北京")}
    # half-width marks (a WordPiece tokenizer's NFKC), another order, a part left out
    assert parse_entities("地名:北京;人名:江泽民") == {("PER", "江泽民"), ("LOC", "北京")}
    assert parse_entities("机构名：新华社、国务院。") == {("ORG", "新华社"), ("ORG", "国务院")}
    assert parse_entities("不知道") == set()
    assert entity_f1([gold], [gold]) == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    got = entity_f1(["人名：江泽民；地名：上海；机构名：无", "人名：无；地名：无；机构名：无"],
                    [gold, "人名：无；地名：无；机构名：新华社"])
    # 1 right of 2 named; 1 found of 4 gold
    assert got["precision"] == pytest.approx(0.5) and got["recall"] == pytest.approx(0.25)
    assert got["f1"] == pytest.approx(2 * 0.5 * 0.25 / 0.75)
    assert entity_f1(["人名：无；地名：无；机构名：无"], ["人名：无；地名：无；机构名：无"])["f1"] == 1.0

    assert [sentiment_of(r) for r in ("积极", "消极。", "积极还是消极", "好评")] == ["pos", "neg", None, None]
    assert sentiment_accuracy(["积极", "消极", "不好说", "积极"], ["pos", "pos", "neg", "pos"]) == 0.5

    quatrain = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
    assert in_form(quatrain, 4, 5) and not in_form(quatrain, 4, 7) and not in_form(quatrain, 8, 5)
    assert in_form("床前明月光,疑是地上霜。举头望明月,低头思故乡。", 4, 5)  # NFKC'd commas
    assert not in_form("床前明月光，疑是地上霜。举头望明月，低头思故。", 4, 5)  # one line short
    assert poem_form_share([quatrain, "春眠不觉晓"], [(4, 5), (4, 5)]) == 0.5

    records = [{"task": "entities", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": gold}]},
               {"task": "sentiment", "meta": {"label": "neg"},
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "消极"}]},
               {"task": "poem", "meta": {"lines": 4, "chars_per_line": 5},
                "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": quatrain}]},
               {"task": "continuation", "messages": [{"role": "user", "content": "q"},
                                                     {"role": "assistant", "content": "a"}]}]
    assert score(records, [gold, "积极", quatrain, "x"]) == {
        "records": {"continuation": 1, "entities": 1, "poem": 1, "sentiment": 1},
        "entity_f1": 1.0, "sentiment_accuracy": 0.0, "poem_form_share": 1.0}


@pytest.fixture
def tiny_chat_model(tmp_path):
    """A 1-layer Llama on gpt-zh's tokenizer, with the chat template, saved as a model directory.
    Its weights are drawn wide (std 0.5) so greedy replies vary from token to token."""
    from sampan.models.registry import create
    from sampan.store.models import resolve
    from sampan.text.tokenizer import ChineseTokenizer

    words = ChineseTokenizer.load(resolve("gpt-zh") / "tokenizer.json")
    torch.manual_seed(0)
    model = create("llama-tiny", vocab_size=words.vocab_size, hidden_size=32, num_layers=1, num_heads=2,
                   num_kv_heads=2, intermediate_size=64, max_position_embeddings=96, eos_token_id=3, pad_token_id=0,
                   rope_scaling=None, rope_theta=10000.0, initializer_range=0.5).eval()
    directory = tmp_path / "tiny-chat"
    model.save_pretrained(directory)
    tokenizer = save_chat_tokenizer(words, directory, 96)
    return model, tokenizer, directory


def test_taskflow_chat_and_module_chat_on_a_tiny_model(tiny_chat_model, tmp_path, monkeypatch):
    from sampan import hub
    from sampan.taskflow import Taskflow

    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))  # the export cache
    model, tokenizer, directory = tiny_chat_model
    # the template: [CLS], role names, [SEP] after every turn, the assistant's prompt last
    assert tokenizer.apply_chat_template([{"role": "user", "content": "你好"}], add_generation_prompt=True,
                                         tokenize=False) == "[CLS]用户：你好[SEP]助手："
    conversations = [[{"role": "system", "content": "你是一个乐于助人的中文助手。"},
                      {"role": "user", "content": "判断这条评论的情感：质量很好，推荐购买"}],
                     [{"role": "user", "content": "你好"}]]
    eager = generate_replies(model, tokenizer, conversations, max_new_tokens=10)
    assert len(set(eager[0])) > 3  # not one token over and over: the comparison below means something

    chat = Taskflow("chat", model=str(directory), max_tokens=10)
    out = chat(conversations)
    # the exported graph decodes greedily to the eager model's replies, batched or one at a time
    assert [r["reply"] for r in out] == eager
    assert chat(conversations[1]) == [out[1]] and chat("你好")[0]["reply"] == eager[1]
    assert out[0]["finish_reason"] in ("stop", "length") and out[0]["messages"] == conversations[0]
    # sampling: a seed repeats a reply; the Taskflow's own settings are back after a call's
    hot = dict(temperature=1.5, top_p=0.95, seed=7)
    assert chat.task.reply("你好", **hot) == chat.task.reply("你好", **hot)
    assert {chat.task.reply("你好", temperature=1.5, seed=s)[0]["reply"] for s in range(4)} != {eager[1]}
    assert chat("你好")[0]["reply"] == eager[1]
    assert chat.task.reply("你好", max_tokens=3)[0]["reply"] == generate_replies(model, tokenizer, conversations[1:], 3)[0]

    module = hub.Module(name="chat-zh-tiny", model=str(directory), max_tokens=10)
    assert module.chat(conversations[0]) == eager[0]
    assert module.chat("你好") == eager[1]
    assert module.chat([conversations[0], "你好"]) == eager
    assert module.chat("你好", temperature=1.5, seed=7) == chat.task.reply("你好", **{**hot, "top_p": 1.0})[0]["reply"]

    for bad, match in (([{"role": "bot", "content": "hi"}], "role one of"), ([], "empty list"), (None, "got NoneType"),
                       ([{"role": "user", "content": " "}], "non-empty string content")):
        with pytest.raises(ValueError, match=match):
            chat(bad)
    with pytest.raises(ValueError, match="chat does not take 'temprature'"):
        chat.task.reply("你好", temprature=0.5)
    with pytest.raises(ValueError, match="does not take 'temprature'"):
        Taskflow("chat", model=str(directory), temprature=0.5)
    with pytest.raises(ValueError, match="top_p"):
        module.chat("你好", top_p=0)


def test_evaluate_chat_scores_generated_replies(tiny_chat_model):
    model, tokenizer, _ = tiny_chat_model
    quatrain = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
    records = [{"task": "poem", "meta": {"lines": 4, "chars_per_line": 5},
                "messages": [{"role": "user", "content": "以《静夜思》为题，写一首五言绝句。"},
                             {"role": "assistant", "content": quatrain}]},
               {"task": "sentiment", "meta": {"label": "pos"},
                "messages": [{"role": "user", "content": "评论：很好\n积极还是消极？"}, {"role": "assistant", "content": "积极"}]},
               {"task": "segmentation", "messages": [{"role": "user", "content": "分词：我爱北京"},
                                                     {"role": "assistant", "content": "我 爱 北京"}]}]
    result = evaluate_chat(model, tokenizer, records, max_new_tokens=12)
    # a random model's replies: scored (not crashed), and the unscored task is left out
    assert result["records"] == {"poem": 1, "sentiment": 1}
    assert result["poem_form_share"] == 0.0 and result["sentiment_accuracy"] in (0.0, 1.0)
    # the sentiment reply is the greedy 8 tokens generate_replies gives
    assert [e["reply"] for e in result["examples"]] [1] == generate_replies(
        model, tokenizer, [records[1]["messages"][:-1]], max_new_tokens=8)[0]

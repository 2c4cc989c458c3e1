"""Taskflow on the shipped models, through the inference predictor: every task, batching, bad input."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from sampan.taskflow import Taskflow
from sampan.text.tokenizer import MASK_ID


@pytest.fixture(scope="module", autouse=True)
def sampan_home(tmp_path_factory):
    """A private $SAMPAN_HOME: only the shipped models resolve, and exports go to a fresh cache."""
    home = tmp_path_factory.mktemp("sampan-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAMPAN_HOME", str(home))
        yield home


@pytest.fixture(scope="module")
def sentiment():
    return Taskflow("sentiment_analysis")


@pytest.fixture(scope="module")
def ner():
    return Taskflow("ner", batch_size=4)


@pytest.mark.slow
def test_readme_snippet_sentiment(sentiment):
    out = sentiment("这家餐厅的服务非常棒")
    assert out[0]["text"] == "这家餐厅的服务非常棒"
    assert out[0]["label"] == "positive"
    assert 0.5 < out[0]["score"] <= 1.0
    negative = sentiment("质量太差了，用了两天就坏，非常失望")
    assert negative[0]["label"] == "negative"


@pytest.mark.slow
def test_sentiment_runs_through_the_exported_graph(sentiment, sampan_home):
    """The task's logits are the ONNX predictor's, and they equal the eager (merged) model's."""
    from sampan.finetune import load_task_model
    from sampan.inference import Predictor
    from sampan.taskflow.encoding import encode_texts
    from sampan.utils.paths import cache_dir

    loaded = sentiment.task.loaded
    assert isinstance(loaded.predictor, Predictor)
    assert loaded.inference_dir.is_relative_to(cache_dir("inference"))  # the export cache, made on first use
    assert (loaded.inference_dir / "inference.onnx").is_file()
    texts = ["物流很快，包装完好", "太难用了", "一般般吧，没有想象中好，但也不算差"]
    enc = encode_texts(loaded.tokenizer, texts, 128)
    (logits,) = loaded.predictor.run({"input_ids": enc.input_ids, "attention_mask": enc.attention_mask})
    model, _, _ = load_task_model(loaded.directory)
    with torch.no_grad():
        eager = model.float()(torch.from_numpy(enc.input_ids), attention_mask=torch.from_numpy(enc.attention_mask))
    np.testing.assert_allclose(logits, eager.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_batches_give_the_same_answers_as_single_texts(sentiment):
    texts = ["很好用，推荐购买", "客服态度恶劣", "还行", "这本书写得太精彩了，一口气读完"]
    batched = Taskflow("sentiment_analysis", batch_size=3)(texts)
    single = [sentiment(t)[0] for t in texts]
    assert [r["label"] for r in batched] == [r["label"] for r in single]
    np.testing.assert_allclose([r["score"] for r in batched], [r["score"] for r in single], atol=2e-4)


@pytest.mark.slow
@pytest.mark.parametrize("bad, message", [
    (None, "is None"),
    (123, "got int"),
    ([], "empty list"),
    (["好", ""], r"\[1\] is empty"),
    (["好", 5], r"\[1\] is a int"),
    ("   ", r"\[0\] is empty"),
])
def test_bad_inputs_are_clear_value_errors(sentiment, bad, message):
    with pytest.raises(ValueError, match=message):
        sentiment(bad)


@pytest.mark.slow
def test_over_long_text_is_truncated_with_a_warning(sentiment):
    text = "服务很好。" * 60
    from sampan.taskflow.encoding import TruncationWarning

    with pytest.warns(TruncationWarning, match=r"text \[0\] has \d+ tokens; only the first 126"):
        out = sentiment(text)
    assert out[0]["text"] == text and out[0]["label"] in ("positive", "negative")


@pytest.mark.slow
def test_ner_finds_people_and_places_with_offsets(ner):
    text = "江泽民主席在北京会见了美国总统克林顿。"
    (out,) = ner(text)
    for ent in out["entities"]:
        assert text[ent["start"]:ent["end"]] == ent["text"]
        assert ent["type"] in ("PER", "LOC", "ORG")
    found = {(e["text"], e["type"]) for e in out["entities"]}
    assert ("江泽民", "PER") in found
    assert ("北京", "LOC") in found


@pytest.mark.slow
def test_ner_tags_every_window_of_a_long_text(ner):
    """A text far longer than the model's window is tagged window by window, offsets shifted back."""
    filler = "今天天气很好，大家都去公园散步了。" * 20
    text = filler + "李鹏总理在上海视察。"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no truncation warning: nothing is cut
        (out,) = ner(text)
    for ent in out["entities"]:
        assert text[ent["start"]:ent["end"]] == ent["text"]
    # Each window is tagged as if it were a text of its own, its spans shifted to its start.
    from sampan.text.windows import sentence_windows

    pieces = sentence_windows(text, ner.task.max_length - 2)
    assert len(pieces) >= 3 and pieces[-1][1] == len(text)
    expected = []
    for start, end in pieces:
        (alone,) = ner(text[start:end])
        expected += [{**e, "start": e["start"] + start, "end": e["end"] + start} for e in alone["entities"]]
    assert out["entities"] == expected
    assert any(e["start"] >= len(filler) for e in expected)  # the last window's sentence was tagged


@pytest.mark.slow
def test_ner_decodes_with_the_tag_prior_its_fine_tune_picked(ner):
    """Taskflow's spans are the predictor's logits decoded with task.json's tag-bigram prior (what the
    card's figures measured), and on held-out sentences the prior changes some of them."""
    from sampan.finetune import load_task_data
    from sampan.finetune.tags import decode_entities, tag_path
    from sampan.taskflow.encoding import encode_texts

    task = ner.task
    assert task.transitions is not None
    assert task.transitions.weight == task.loaded.task_meta["tag_transitions"]["weight"] > 0
    texts = [ex.text for ex in load_task_data("ner", max_eval_examples=96).test]
    out = ner(texts)
    changed = 0
    for start in range(0, len(texts), 32):
        batch = texts[start:start + 32]
        enc = encode_texts(task.loaded.tokenizer, batch, task.max_length)
        (logits,) = task.loaded.predictor.run({"input_ids": enc.input_ids, "attention_mask": enc.attention_mask})
        for row, text in enumerate(batch):
            n, offsets = enc.lengths[row], enc.offsets[row][: enc.lengths[row]]
            with_prior = decode_entities(text, offsets, tag_path(logits[row][:n], offsets, task.labels,
                                                                 task.transitions), task.labels)
            alone = decode_entities(text, offsets, tag_path(logits[row][:n], offsets, task.labels), task.labels)
            assert out[start + row]["entities"] == with_prior
            changed += with_prior != alone
    assert changed > 0


def test_word_segmentation():
    (out,) = Taskflow("word_segmentation")("我爱北京天安门")
    assert out["words"] == ["我", "爱", "北京", "天安门"]


@pytest.mark.slow
def test_text_generation_is_seeded_and_continues_in_chinese():
    gen = Taskflow("text_generation", max_new_tokens=16, seed=3)
    first = gen(["话说天下大势", "中国经济"])
    again = Taskflow("text_generation", max_new_tokens=16, seed=3)(["话说天下大势", "中国经济"])
    assert first == again
    for row in first:
        assert 0 < len(row["generated"]) and re.search(r"[\u4e00-\u9fff]", row["generated"])


def test_poetry_keeps_its_form():
    (out,) = Taskflow("poetry_generation", line_chars=5, seed=1)("春风")
    lines = re.findall(r"[^，。]+[，。]", out["poem"])
    assert len(lines) == 4, out["poem"]
    assert all(len(line) == 6 and re.fullmatch(r"[\u4e00-\u9fff]{5}[，。]", line) for line in lines)
    assert out["poem"].startswith("春风")


@pytest.mark.slow
def test_fill_mask_fills_every_mask():
    fill = Taskflow("fill_mask", top_k=3)
    (out,) = fill("中华人民共和[MASK]成立五十周年")
    assert len(out["predictions"]) == 3
    scores = [p["score"] for p in out["predictions"]]
    assert scores == sorted(scores, reverse=True)
    assert all("[MASK]" not in p["sequence"] and len(p["token"]) >= 1 for p in out["predictions"])
    # The predictor path ranks exactly what the eager model does (special tokens excluded). How
    # good the ranking is belongs to the model: its card has the held-out MLM accuracy.
    from sampan.hub import resolve
    from sampan.models.pretrained import from_pretrained

    enc = fill.task.loaded.tokenizer.encode(out["text"].replace("[MASK]", "国"))
    ids = torch.tensor([enc.ids])
    position = enc.tokens.index("国")
    ids[0, position] = MASK_ID
    with torch.no_grad():
        logits = from_pretrained(resolve("ernie-tiny-zh")).float().eval()(ids)[0, position]
    logits[:5] = -float("inf")
    eager = [fill.task.loaded.tokenizer.id_to_token(int(i)) for i in logits.topk(3).indices]
    assert [p["token"] for p in out["predictions"]] == eager
    with pytest.raises(ValueError, match=r"\[0\] has no \[MASK\]"):
        fill("没有掩码")


@pytest.mark.slow
def test_int8_precision_agrees_with_fp32(sentiment):
    texts = ["很好用，推荐购买", "客服态度恶劣，再也不买了", "这家餐厅的服务非常棒", "质量一般，价格偏贵"]
    int8 = Taskflow("sentiment_analysis", precision="int8")
    assert int8.task.loaded.predictor.model_path.name.endswith("int8.onnx")
    assert [r["label"] for r in int8(texts)] == [r["label"] for r in sentiment(texts)]


def test_tasks_listing_and_unknown_names():
    tasks = Taskflow.tasks()
    assert {"sentiment_analysis", "ner", "word_segmentation", "text_generation", "poetry_generation",
            "fill_mask"} <= set(tasks)
    assert tasks["sentiment_analysis"]["default_model"] == "ernie-mini-sentiment"
    with pytest.raises(ValueError, match="unknown task 'translation'; tasks: chat, document, fill_mask, layout, ner"):
        Taskflow("translation")
    with pytest.raises(ValueError, match="unknown task 'sentiment'; did you mean 'sentiment_analysis'\\? tasks:"):
        Taskflow("sentiment")
    # an option the task does not read is refused, with the closest one named, before any model loads
    with pytest.raises(ValueError, match="text_generation does not take 'temprature'; for 'temprature', did you mean 'temperature'\\?"):
        Taskflow("text_generation", temprature=0.5)
    with pytest.raises(ValueError, match=r"sentiment_analysis does not take 'top_k' \(its options: none"):
        Taskflow("sentiment_analysis", top_k=3)
    with pytest.raises(ValueError, match="name two models; pass one"):
        Taskflow("sentiment_analysis", model="ernie-mini-sentiment", task_path="/elsewhere")
    from sampan.hub import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="unknown model 'no-such-model'"):
        Taskflow("sentiment_analysis", model="no-such-model")


@pytest.mark.slow
def test_sampan_task_takes_task_options_and_max_length(sampan_home, capsys):
    import json

    from sampan.cli import main as cli_main

    assert cli_main(["task", "poetry_generation", "春", "秋", "--option", "line_chars=5", "--option", "seed=1"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows == Taskflow("poetry_generation", line_chars=5, seed=1)(["春", "秋"])
    assert all(len(line) == 5 for row in rows for line in re.split("[，。]", row["poem"]) if line)
    with pytest.warns(UserWarning, match="only the first 14 are used"):
        assert cli_main(["task", "sentiment_analysis", "这家餐厅的服务非常棒，菜也很好吃。", "--max-length", "16"]) == 0
    capsys.readouterr()
    for option, says in (("line_char=5", "for 'line_char', did you mean 'line_chars'"),
                         ("line_chars", "--option 'line_chars' must look like KEY=VALUE")):
        assert cli_main(["task", "poetry_generation", "春", "--option", option]) == 2
        assert says in capsys.readouterr().err


@pytest.mark.slow
def test_hub_module_passes_options_and_model_to_its_task(sampan_home):
    import sampan.hub as hub

    module = hub.Module(name="ernie_gen", max_new_tokens=4, min_new_tokens=4, seed=2)
    assert module.generate(text="话说") == Taskflow("text_generation", max_new_tokens=4, min_new_tokens=4,
                                                      seed=2)("话说")[0]["generated"]
    with pytest.raises(ValueError, match="text_generation does not take 'max_tokens'"):
        hub.Module(name="ernie_gen", max_tokens=4)
    with pytest.raises(hub.ModelNotFoundError, match="unknown model 'gpt-x'"):
        hub.Module(name="ernie_gen", model="gpt-x")  # model= reaches the task instead of colliding with it
    with pytest.raises(ValueError, match="unknown hub module 'ernie_genn'; did you mean 'ernie_gen'"):
        hub.Module(name="ernie_genn")


@pytest.mark.slow
def test_readme_snippets_run_in_a_fresh_process(sampan_home):
    code = ("from sampan import Taskflow\n"
            "sentiment_analysis = Taskflow('sentiment_analysis')\n"
            "print(sentiment_analysis('这家餐厅的服务非常棒'))\n"
            "import sampan.hub as hub\n"
            "module = hub.Module(name='ernie_gen')\n"
            "print(module.generate(text='人工智能的发展趋势'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True,
                         env={**__import__("os").environ, "SAMPAN_HOME": str(sampan_home)})
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("[{'text': '这家餐厅的服务非常棒', 'label': 'positive', 'score': 0.")
    assert re.search(r"[\u4e00-\u9fff]", lines[1])
    # What README and docs/taskflow.md show after each print is what it prints (the shipped models
    # and the generation seed are fixed), so a rebuilt model cannot leave a stale figure there.
    root = Path(__file__).resolve().parents[1]
    for doc in ("README.md", "docs/taskflow.md"):
        text = (root / doc).read_text(encoding="utf-8")
        shown = [re.search(rf"{re.escape(call)}\)+ *# (.+)$|{re.escape(call)}\)+\n# (.+)$", text, re.M)
                 for call in ('print(sentiment_analysis("这家餐厅的服务非常棒"', 'print(module.generate(text="人工智能的发展趋势"')]
        assert all(shown), doc
        assert [m.group(1) or m.group(2) for m in shown] == lines, doc


@pytest.mark.slow
def test_a_deployed_taskflow_imports_no_torch(sampan_home):
    """Once a model is exported, running it needs ONNX Runtime, numpy and the tokenizer only: every
    task answers in a fresh process without importing torch (about 1 s of start-up saved), and
    answers what this process, which has torch, answers."""
    import json
    import os

    texts = {"sentiment_analysis": "这家餐厅的服务非常棒", "ner": "毛泽东在北京会见了克林顿总统。",
             "word_segmentation": "我爱北京天安门", "fill_mask": "中国的首都是北[MASK]", "text_generation": "三国",
             "poetry_generation": "春"}
    here = {task: Taskflow(task)(text) for task, text in texts.items()}  # exports what is not cached yet
    code = ("import json, sys\nfrom sampan import Taskflow\n"
            f"texts = {texts!r}\n"
            "out = {task: Taskflow(task)(text) for task, text in texts.items()}\n"
            "print(json.dumps({'torch': 'torch' in sys.modules, 'out': out}, ensure_ascii=False))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True,
                         env={**os.environ, "SAMPAN_HOME": str(sampan_home)})
    fresh = json.loads(run.stdout.strip().splitlines()[-1])
    assert fresh["torch"] is False
    assert fresh["out"] == json.loads(json.dumps(here, ensure_ascii=False))


def test_tasks_benchmark_only_picks_sections_and_never_overwrites_the_full_results(monkeypatch, capsys):
    import importlib.util
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))
    spec = importlib.util.spec_from_file_location("bench_tasks", bench / "tasks.py")
    tasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tasks)
    with pytest.raises(SystemExit):
        tasks.parse_args(["--only", "ner_modern"])
    assert "--only writes a partial result: give --out FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tasks.parse_args(["--only", "nerr", "--out", "x.json"])
    assert "invalid choice: 'nerr'" in capsys.readouterr().err
    args = tasks.parse_args(["--only", "ner", "--only", "ner_modern", "--out", "x.json", "--ner-model", "DIR"])
    assert args.only == ["ner", "ner_modern"] and args.ner_model == "DIR" and args.sentiment_model is None


@pytest.mark.slow
def test_tasks_benchmark_quick(sampan_home, sentiment, tmp_path):
    """benchmarks/tasks.py --quick runs every section and writes the figures the README table reads."""
    import json
    import os
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "tasks.json"
    subprocess.run([sys.executable, str(root / "benchmarks" / "tasks.py"), "--quick", "--out", str(out)],
                   check=True, timeout=900, env={**os.environ, "SAMPAN_HOME": str(sampan_home)})
    r = json.loads(out.read_text())
    sent = r["sentiment"]
    # Quality floors. --quick scores the shipped models (inference on fixed weights, the same figures
    # every run on one machine) on the first 64 test reviews, 35 of them negative: a constant answer
    # scores 0.547. Measured (ernie-mini-sentiment): sampan 0.844 (54 of 64; 0.859 on the whole split),
    # its int8 copy the same, the TF-IDF baseline 0.797 (51), the linear SVM and word+char LR references
    # 0.812 (52) and the sampan+baseline average 0.828 (53). Each floor sits four reviews (0.0625) below the lowest figure
    # it covers: room for another CPU's rounding or a rebuild of equal quality, not for a model that
    # has lost a tenth of its accuracy.
    assert sent["test_examples"] == 64
    assert 0.78 <= sent["sampan_accuracy"] <= 1 and 0.73 <= sent["baseline_accuracy"] <= 1, sent
    assert 0.78 <= r["int8_vs_fp32"]["int8"]["accuracy"] <= 1, r["int8_vs_fp32"]
    assert max(sent["sampan_accuracy"], sent["baseline_accuracy"]) <= sent["either_correct"] <= 1
    assert all(row["label"] in ("positive", "negative") and row["text"] for row in sent["both_wrong_sample"])
    # The paired difference is the two accuracies' difference, and its discordant counts add up to it.
    diff = sent["sampan_minus_baseline"]
    assert diff["difference"] == pytest.approx(sent["sampan_accuracy"] - sent["baseline_accuracy"])
    assert (diff["only_a_correct"] - diff["only_b_correct"]) == round(diff["difference"] * sent["test_examples"])
    assert diff["ci95"][0] <= diff["difference"] <= diff["ci95"][1]
    assert {"char_1_3_linear_svm", "word_1_2_plus_char_1_3_lr", "sampan_baseline_average"} == set(sent["references"])
    assert all(0.75 <= ref["accuracy"] <= 1 for ref in sent["references"].values()), sent["references"]
    # --quick fits each classical model at the C the full run chose on dev, which must still be so.
    full = json.loads((root / "benchmarks" / "results" / "tasks.json").read_text())["sentiment"]
    assert re.search(r"\(C=([\d.]+) ", full["baseline"])[1] == re.search(r"\(C=([\d.]+) ", sent["baseline"])[1]
    for key in ("char_1_3_linear_svm", "word_1_2_plus_char_1_3_lr"):
        assert full["references"][key]["C"] == sent["references"][key]["C"]
    # The count is the reviews whose tokens overflow the model's window, counted here directly.
    from sampan.finetune.data import load_task_data

    texts = [ex.text for ex in load_task_data("sentiment_analysis").test[:sent["test_examples"]]]
    task = sentiment.task
    overflow = sum(len(e.ids) > task.max_length for e in task.loaded.tokenizer.encode_batch(texts))
    assert sent["truncated_reviews"] == overflow
    parts = sent["by_length"]
    assert parts["longer_than_window"]["reviews"] == overflow
    assert parts["longer_than_window"]["reviews"] + parts["within_window"]["reviews"] == sent["test_examples"]
    for system in ("sampan", "baseline"):  # the two parts' accuracies weigh back to the whole
        whole = sum(p[f"{system}_accuracy"] * p["reviews"] for p in parts.values() if p["reviews"])
        assert whole == pytest.approx(sent[f"{system}_accuracy"] * sent["test_examples"])
    assert {"PER", "LOC", "micro"} <= set(r["ner"]["sampan"]) and {"PER", "LOC"} <= set(r["ner"]["lac"])
    # NER on the first 24 test sentences, on the word-level gold the shipped model was trained on (43
    # gold entities): its micro F1 is 0.977 (one entity wrong; 0.924 on the whole split), LAC's
    # zero-shot 0.750. A wrong entity costs ~0.023 here, so the floors allow three more for sampan and
    # four for LAC. These 24 sentences are easy: a model at 0.830 on test_hub's 200 (noise on its
    # weights) still scores 0.938 here, so that floor, not this one, is what holds the NER model's
    # quality. On the gold with the compound names rebuilt (40 entities; peoples_daily.py) the same
    # model scores 0.747 and LAC 0.918; on the first 24 modern sentences (35 entities) 0.467 and
    # 0.899. Those floors sit three entities below.
    old = r["ner"]["old_style_gold"]
    assert old["sampan"]["micro"]["f1"] >= 0.90 and old["lac"]["micro"]["f1"] >= 0.65, old
    assert r["ner"]["sampan"]["micro"]["f1"] >= 0.67 and r["ner"]["lac"]["micro"]["f1"] >= 0.84, r["ner"]
    modern = r["ner_modern"]
    assert modern["test_sentences"] == 24 and modern["gold_entities"] == 35
    assert modern["sampan"]["micro"]["f1"] >= 0.38 and modern["lac"]["micro"]["f1"] >= 0.82, modern
    arms = r["lora_vs_full"]
    assert arms["lora"]["trainable_parameters"] < arms["full_frozen"]["trainable_parameters"] < \
        arms["full"]["trainable_parameters"]
    assert r["int8_vs_fp32"]["size_ratio_int8_over_fp32"] < 0.5
    assert r["throughput"]["batch32"]["predictor"]["sentences_per_s"] > 0

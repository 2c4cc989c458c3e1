"""``sampan data build`` + ``sampan pretrain`` end to end on tiny slices of the corpora."""

from __future__ import annotations

import json
import shutil
import unicodedata

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sampan.checkpoint.files import hash_file
from sampan.cli import main
from sampan.pretraining import MLMBatcher, PretrainConfig, pretrain
from sampan.pretraining.evaluate import char_mlm_accuracy, entity_cloze_accuracy, gold_entity_spans
from sampan.text.build import DataBuildConfig, build_data, encode_parallel, load_manifest
from sampan.text.corpus import load_corpus
from sampan.text.features import CharFeatures
from sampan.text.masking import KnowledgeMasker
from sampan.text.shards import SpanShardDataset
from sampan.text.spans import GOLD_ENTITY_BEGIN, IN_GOLD_ENTITY, SPECIAL
from sampan.text.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID, ChineseTokenizer

BUILD_ARGS = ["--corpus", "news,reviews", "--max-docs", "40", "--seq-len", "64", "--vocab-size", "3000"]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "build"
    assert main(["data", "build", *BUILD_ARGS, "--out", str(out)]) == 0
    return out


def test_data_build_writes_shards_spans_and_a_manifest(build, capsys):
    manifest = load_manifest(build)
    assert [(s["corpus"], s["split"]) for s in manifest["shards"]] == [
        ("news", "train"), ("news", "test"), ("reviews", "train")]  # the reviews test split is never built
    for shard in manifest["shards"]:
        for kind, name in shard["files"].items():
            assert hash_file(build / name)["sha256"] == shard["sha256"][kind]
    for name, record in manifest["files"].items():
        assert hash_file(build / name) == record
    assert not [p for p in build.parent.iterdir() if p.name.startswith(".")]  # no temp dir left behind
    data = SpanShardDataset(build, "train")
    assert len(data) == sum(s["rows"] for s in manifest["shards"] if s["split"] == "train")
    for i in range(len(data)):
        ids, flags = data.row(i)
        assert ids[0] == CLS_ID
        end = int(np.flatnonzero(ids == SEP_ID)[0])
        assert (ids[end + 1:] == PAD_ID).all() and ((flags[end:] & SPECIAL) != 0).all()
        assert ((flags[1:end] & SPECIAL) == 0).all()
    # Asking for the same directory again without --overwrite is refused, with the fix named.
    assert main(["data", "build", *BUILD_ARGS, "--out", str(build)]) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_shard_rows_hold_each_documents_text(build):
    tok = ChineseTokenizer.load(build / "tokenizer.json")
    data = SpanShardDataset(build, "train", ["news"])
    docs = {d.id: d for d in load_corpus("news", "train")[:40]}
    rows = json.loads((build / "news.train.docs.json").read_text(encoding="utf-8"))
    assert [doc_id for doc_id, _, _ in rows] == list(docs)
    for doc_id, first, count in rows:
        text = "".join(tok.decode(data.row(r)[0]) for r in range(first, first + count))
        expected = unicodedata.normalize("NFKC", docs[doc_id].text).lower()
        assert "".join(text.split()) == "".join(expected.split())


def test_gold_entities_are_flagged_on_their_tokens(build):
    tok = ChineseTokenizer.load(build / "tokenizer.json")
    data = SpanShardDataset(build, "train", ["news"])
    names = set()
    for i in range(len(data)):
        ids, flags = data.row(i)
        for s, e in gold_entity_spans(flags):
            assert flags[s] & GOLD_ENTITY_BEGIN and (flags[s:e] & IN_GOLD_ENTITY).all()
            names.add(tok.decode(ids[s:e]))
    assert {"江泽民", "中国", "香港"} <= names


def test_data_build_is_deterministic(build, tmp_path):
    config = DataBuildConfig(corpora=("news", "reviews"), out=str(tmp_path / "again"), max_docs=40, seq_len=64,
                             vocab_size=3000)
    again = build_data(config, log=lambda _: None)
    first = load_manifest(build)
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in first["shards"]]
    assert again["files"] == first["files"]
    with pytest.raises(ValueError, match="gold segmentation"):
        build_data(DataBuildConfig(corpora=("sanguo",), out=str(tmp_path / "g"), spans="gold", max_docs=2))


@pytest.mark.slow
def test_parallel_encoding_gives_the_same_rows(build, monkeypatch):
    tok = ChineseTokenizer.load(build / "tokenizer.json")
    docs = load_corpus("news", "train")[:30]
    monkeypatch.setattr("sampan.text.build._CHUNK_CHARS", 600)  # several chunks per worker
    # Gold spans: the workers need neither jieba nor LAC, which keeps this test quick.
    one = encode_parallel(docs, tok, 64, "gold", "none", workers=1)
    two = encode_parallel(docs, tok, 64, "gold", "none", workers=2)
    assert (one[0] == two[0]).all() and (one[1] == two[1]).all() and one[2] == two[2]
    assert len(one[2]) == 30 and one[2][-1][1] + one[2][-1][2] == len(one[0])


@pytest.mark.slow
def test_pretrain_cli_trains_and_the_loss_falls(build, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["pretrain", "--model", "ernie-tiny", "--data", str(build), "--masking", "knowledge",
                 "--steps", "40", "--batch-size", "8", "--learning-rate", "2e-3", "--warmup-steps", "5",
                 "--logging-steps", "5", "--eval-rows", "32", "--output-dir", str(out),
                 "--override", "num_layers=2", "--override", "hidden_size=128"])
    assert code == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed[printed.index("\n{") + 1:])
    assert [level for _, level in summary["stages"]] == ["char", "phrase", "entity"]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [m["loss"] for m in lines if "loss" in m]
    assert len(losses) == 8
    # The staged schedule ends on the hardest level (whole entities), and still the loss falls.
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.5, losses
    assert any("eval_loss" in m for m in lines)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "features.json"):
        assert (out / "model" / name).is_file()
    assert json.loads((out / "model" / "config.json").read_text())["num_layers"] == 2
    assert list(out.glob("checkpoint-*")) and (out / "tensorboard").is_dir() and (out / "report.png").is_file()


def test_staged_masking_resumes_exactly(build, tmp_path):
    def config(out, resume=False):
        return PretrainConfig(data=str(build), eval_rows=8,
                              model={"name": "ernie-tiny", "overrides": {"num_layers": 1, "hidden_size": 64,
                                                                        "num_heads": 2}},
                              training={"output_dir": str(out), "max_steps": 12, "save_steps": 6,
                                        "per_device_train_batch_size": 4, "learning_rate": 1e-3, "warmup_steps": 2,
                                        "logging_steps": 6, "resume_from_checkpoint": "auto" if resume else None})

    trainer, summary = pretrain(config(tmp_path / "a"))
    assert summary["stages"] == [(0, "char"), (3, "phrase"), (6, "entity")]  # 20% / 30% / 50% of 12 steps
    straight = load_file(tmp_path / "a" / "model" / "model.safetensors")
    pretrain(config(tmp_path / "b"))
    (last,) = (tmp_path / "b").glob("checkpoint-*12")
    shutil.rmtree(last)  # as if killed after the step-6 checkpoint
    pretrain(config(tmp_path / "b", resume=True))
    resumed = load_file(tmp_path / "b" / "model" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=0)


def test_features_flag_adds_pinyin_radical_stroke_embeddings(build, tmp_path):
    trainer, _ = pretrain(PretrainConfig(
        data=str(build), features=("pinyin", "radical", "stroke"), eval_rows=4,
        model={"name": "ernie-tiny", "overrides": {"num_layers": 1, "hidden_size": 64, "num_heads": 2}},
        training={"output_dir": str(tmp_path / "f"), "max_steps": 2, "per_device_train_batch_size": 4}))
    config = trainer.model.config
    features = CharFeatures.load(build / "features.json")
    assert config.pinyin_vocab_size == len(features.pinyin_vocab) > 300
    assert config.radical_vocab_size == len(features.radical_vocab) > 100 and config.stroke_vocab_size == 64
    assert set(trainer.model.ernie.embeddings.feature_embeddings) == {"pinyin", "radical", "stroke"}
    with pytest.raises(ValueError, match="features"):
        PretrainConfig(features=("tone",))


def test_entity_cloze_and_char_accuracy_evaluate_held_out_news(build):
    from sampan.models import create

    data = SpanShardDataset(build, "test", ["news"])
    manifest = data.manifest
    torch.manual_seed(0)
    model = create("ernie-tiny", vocab_size=manifest["vocab_size"], num_layers=1, hidden_size=64, num_heads=2)
    batcher = MLMBatcher(KnowledgeMasker(manifest["vocab_size"], MASK_ID))
    expected = sum(len(gold_entity_spans(data.row(i)[1])) for i in range(len(data)))
    cloze = entity_cloze_accuracy(model, data, batcher)
    assert cloze["entities"] == expected > 20
    assert 0.0 <= cloze["entity_accuracy"] <= cloze["entity_token_accuracy"] <= 1.0
    chars = char_mlm_accuracy(model, data, batcher, max_rows=16)
    assert chars["masked_tokens"] > 50 and 0.0 <= chars["char_accuracy"] < 0.2  # an untrained model


def test_output_similarity_tells_a_collapsed_encoder_from_a_working_one(build):
    """A random-init encoder gives different outputs at different tokens; one whose last LayerNorm
    has zero gain gives its bias everywhere (what the unigram stage of MLM pretraining approaches)."""
    from sampan.models import create
    from sampan.pretraining.evaluate import output_similarity

    data = SpanShardDataset(build, "test", ["news"])
    torch.manual_seed(0)
    model = create("ernie-tiny", vocab_size=data.manifest["vocab_size"], num_layers=1, hidden_size=64, num_heads=2)
    batcher = MLMBatcher(KnowledgeMasker(data.manifest["vocab_size"], MASK_ID))
    working = output_similarity(model, data, batcher, max_rows=16)
    assert working["tokens"] > 100 and working["token_output_cosine"] < 0.8
    with torch.no_grad():
        last_norm = model.ernie.layers[-1].norm2
        last_norm.weight.zero_()
        last_norm.bias.uniform_(-1, 1)
    assert output_similarity(model, data, batcher, max_rows=16)["token_output_cosine"] > 0.999


def test_best_fit_packing_places_every_item_once_and_fills_rows():
    from sampan.pretraining.packing import best_fit_groups

    sizes = np.random.default_rng(0).integers(5, 120, size=2000)
    groups = best_fit_groups(sizes, 127)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    assert max(sum(sizes[list(g)]) for g in groups) <= 127
    # Best fit gets within a few percent of the lower bound on the number of rows.
    assert len(groups) <= 1.05 * np.ceil(sizes.sum() / 127)
    assert best_fit_groups(sizes, 127) == groups  # deterministic
    with pytest.raises(ValueError, match=r"sizes must lie in \[0, 10\]"):
        best_fit_groups(np.array([3, 11]), 10)


def test_packed_rows_hold_every_documents_tokens_once(build):
    from sampan.pretraining.packing import PackedRows

    base = SpanShardDataset(build, "train")
    packed = PackedRows(base)
    assert len(packed) < len(base) and packed.fill > 0.9
    bodies = []
    for i in range(len(packed)):
        ids, flags = packed.row(i)
        assert ids[0] == CLS_ID and len(ids) == base.seq_len
        real = int((ids != PAD_ID).sum())
        assert ids[real - 1] == SEP_ID and (ids[real:] == PAD_ID).all()
        special = (ids == CLS_ID) | (ids == SEP_ID) | (ids == PAD_ID)
        assert (((flags & SPECIAL) != 0) == special).all()  # the masker never picks a separator
        text = ids[1:real]  # body [SEP] body [SEP] ...
        bodies += [tuple(part) for part in np.split(text, np.flatnonzero(text == SEP_ID)[:-1] + 1)]
    expected = [tuple(ids[1:int((ids != PAD_ID).sum())]) for ids, _ in map(base.row, range(len(base)))]
    assert sorted(bodies) == sorted(expected)

"""sampan.finetune: leak-free splits, BIO tags, span F1, full / LoRA / Adapter training, merge-back,
both output layouts, user JSONL data and the CLI, on a tiny random-init ERNIE base directory."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from sampan.finetune import (
    FinetuneConfig,
    LoRAEmbedding,
    LoRALinear,
    TagTransitions,
    apply_adapters,
    apply_embedding_lora,
    apply_lora,
    bio_labels,
    count_transitions,
    decode_entities,
    encode_bio,
    finetune,
    load_task_data,
    load_task_model,
    merge_lora,
    read_jsonl,
    span_f1,
    tokenize_for_task,
    viterbi_bio,
)
from sampan.models import create
from sampan.models.ernie.config import ErnieConfig
from sampan.text.corpus import load_corpus
from sampan.text.tokenizer import PAD_ID, ChineseTokenizer
from sampan.text.windows import sentence_windows

HIDDEN, LAYERS = 32, 2
NER_LABELS = bio_labels(["PER", "LOC", "ORG"])
# Small runs: a few steps on a few hundred examples, short inputs.
FAST = dict(max_length=48, max_train_examples=320, max_eval_examples=64)
FAST_TRAINING = dict(max_steps=12, per_device_train_batch_size=16, logging_steps=4)


def small(output_dir: Path, learning_rate: float | None = None, **fields) -> FinetuneConfig:
    """A small fine-tune (``FAST``) writing to ``output_dir``; ``fields`` are FinetuneConfig's."""
    training = {**FAST_TRAINING, "output_dir": str(output_dir)}
    if learning_rate is not None:
        training["learning_rate"] = learning_rate
    return FinetuneConfig(**{**FAST, **fields}, training=training)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """A tiny random-init ERNIE MLM saved like `sampan pretrain` output, with a tokenizer trained on corpus lines."""
    texts = [d.text for d in load_corpus("news", "train")[:2500]] + [d.text for d in load_corpus("reviews", "train")[:1500]]
    tokenizer = ChineseTokenizer.train(texts, vocab_size=3000)
    torch.manual_seed(0)
    model = create(ErnieConfig(vocab_size=tokenizer.vocab_size, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=2,
                               max_position_embeddings=64, pad_token_id=PAD_ID), head="masked_lm")
    out = tmp_path_factory.mktemp("base") / "ernie-micro"
    model.save_pretrained(out)
    tokenizer.save(out / "tokenizer.json")
    return out


@pytest.fixture(scope="module")
def runs(base_dir, tmp_path_factory):
    """Fine-tunes shared by several tests, each run once: {name: FinetuneResult}."""
    root = tmp_path_factory.mktemp("runs")
    specs = {
        "full": dict(method="full", learning_rate=1e-3),
        "lora": dict(method="lora", learning_rate=3e-3),
        "lora-adapter-layout": dict(method="lora", learning_rate=3e-3, save="adapter"),
        "adapter": dict(method="adapter", learning_rate=3e-3),
        "adapter-adapter-layout": dict(method="adapter", learning_rate=3e-3, save="adapter"),
        "full-frozen-embeddings": dict(method="full", learning_rate=1e-3, save="adapter",
                                       freeze=("ernie.embeddings.word_embeddings",)),
        "full-embedding-lora": dict(method="full", learning_rate=1e-3, save="adapter", embedding_lora_rank=4,
                                    freeze=("ernie.embeddings.word_embeddings",)),
    }
    return {name: finetune(small(root / name, task="ner", model=str(base_dir), **spec)) for name, spec in specs.items()}


# -- data -------------------------------------------------------------------------------------------
def test_sentiment_splits_are_leak_free():
    data = load_task_data("sentiment_analysis", max_length=128, seed=0)
    train, dev, test = ({ex.text for ex in split} for split in (data.train, data.dev, data.test))
    assert not (test & train) and not (test & dev) and not (dev & train)
    assert data.labels == ["negative", "positive"]
    # the whole deduplicated test split is used; dev is ~10% of the training reviews
    assert len(data.test) == len(load_corpus("reviews", "test"))
    assert 0.07 < len(data.dev) / (len(data.dev) + len(data.train)) < 0.13
    # the dev split depends on the seed, the test split does not
    other = load_task_data("sentiment_analysis", max_length=128, seed=1)
    assert {ex.id for ex in other.dev} != {ex.id for ex in data.dev}
    assert {ex.id for ex in other.test} == {ex.id for ex in data.test}


def test_ner_splits_are_leak_free_by_document_and_text():
    data = load_task_data("ner", max_length=64)
    ids = [{ex.id for ex in split} for split in (data.train, data.dev, data.test)]
    docs = [{ex.group for ex in split} for split in (data.train, data.dev, data.test)]
    texts = [{ex.text for ex in split} for split in (data.train, data.dev, data.test)]
    for a, b in ((0, 1), (0, 2), (1, 2)):
        assert not ids[a] & ids[b] and not docs[a] & docs[b] and not texts[a] & texts[b]
    # People's Daily repeats paragraphs and datelines: those copies were dropped, not scored
    assert data.dropped_duplicates > 0
    assert data.labels == NER_LABELS
    assert max(len(ex.text) for ex in data.train + data.dev + data.test) <= 62
    for ex in data.test[:500]:
        assert all(0 <= s < e <= len(ex.text) for s, e, _ in ex.entities)


def test_sentence_windows_keep_offsets_and_never_cut_an_entity():
    text = "江泽民主席在北京人民大会堂会见了客人。他说，中华人民共和国将继续发展；" + "很" * 30 + "好。"
    entities = [(0, 3, "PER"), (6, 8, "LOC"), (8, 13, "LOC"), (22, 29, "LOC")]
    windows = sentence_windows(text, 12, entities)
    assert all(0 < e - s <= 12 for s, e in windows)
    assert "".join(text[s:e] for s, e in windows) == text  # no blanks here, so windows tile the text
    for s, e in windows:
        assert not any(es < s < ee or es < e < ee for es, ee, _ in entities)


# -- BIO tags and metrics -----------------------------------------------------------------------------
def test_bio_encode_decode_round_trips_gold_spans(base_dir):
    tokenizer = ChineseTokenizer.load(base_dir / "tokenizer.json")
    data = load_task_data("ner", max_length=128, max_eval_examples=400)
    encoded = tokenize_for_task(tokenizer, [ex.text for ex in data.test], 128)
    n_spans = 0
    for ex, enc in zip(data.test, encoded, strict=True):
        tags = encode_bio(enc.offsets, ex.entities, NER_LABELS)
        assert tags[0] == -100 and tags[-1] == -100  # [CLS], [SEP]
        spans = decode_entities(ex.text, enc.offsets, [max(t, 0) for t in tags], NER_LABELS)
        assert sorted((s["start"], s["end"], s["type"]) for s in spans) == sorted(ex.entities)
        assert all(s["text"] == ex.text[s["start"]:s["end"]] for s in spans)
        n_spans += len(spans)
    assert n_spans > 200


def test_bio_handles_word_pieces_and_missing_b_tags(base_dir):
    tokenizer = ChineseTokenizer.load(base_dir / "tokenizer.json")
    text = "iphone在北京"
    enc = tokenize_for_task(tokenizer, [text], 32)[0]
    tags = encode_bio(enc.offsets, [(0, 6, "ORG"), (7, 9, "LOC")], NER_LABELS)
    named = [NER_LABELS[t] if t >= 0 else None for t in tags]
    pieces = len(enc.offsets) - 2 - 3  # tokens of "iphone"
    assert named == [None, "B-ORG"] + ["I-ORG"] * (pieces - 1) + ["O", "B-LOC", "I-LOC", None]
    # an I- without a B- opens a span; a type change closes the previous one
    offsets = [(0, 0), (0, 1), (1, 2), (2, 3), (3, 4), (0, 0)]
    ids = [0, NER_LABELS.index("I-PER"), NER_LABELS.index("I-PER"), NER_LABELS.index("I-LOC"), 0, 0]
    assert decode_entities("王小明好", offsets, ids, NER_LABELS) == [
        {"text": "王小", "type": "PER", "start": 0, "end": 2}, {"text": "明", "type": "LOC", "start": 2, "end": 3}]


def _bio_valid(path, labels):
    prev = "O"
    for tag in (labels[i] for i in path):
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            return False
        prev = tag
    return True


def test_viterbi_bio_finds_the_best_path_the_grammar_allows():
    import itertools

    import numpy as np

    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    rng = np.random.default_rng(0)
    changed = 0
    for _ in range(40):
        scores = rng.normal(size=(4, len(labels))) * 3
        logp = scores - np.logaddexp.reduce(scores, axis=1, keepdims=True)
        path = viterbi_bio(scores, labels)
        assert _bio_valid(path, labels)
        # Brute force over all 5^4 paths: Viterbi's is the best-scoring valid one.
        best = max((p for p in itertools.product(range(len(labels)), repeat=4) if _bio_valid(p, labels)),
                   key=lambda p: logp[np.arange(4), list(p)].sum())
        assert logp[np.arange(4), path].sum() == pytest.approx(logp[np.arange(4), list(best)].sum())
        greedy = scores.argmax(-1).tolist()
        if _bio_valid(greedy, labels):
            assert path == greedy  # a valid arg-max path is kept as it is
        changed += path != greedy
    assert changed > 0  # the random cases did exercise the constraint


def test_viterbi_bio_skips_special_tokens_and_checks_its_input():
    import numpy as np

    labels = ["O", "B-LOC", "I-LOC"]
    # [CLS] 北 京 [SEP]: arg-max says I-LOC I-LOC (no B-); the special tokens must not break the chain.
    scores = np.log(np.array([[0.1, 0.1, 0.8], [0.1, 0.4, 0.5], [0.1, 0.2, 0.7], [0.1, 0.1, 0.8]]))
    path = viterbi_bio(scores, labels, valid=[False, True, True, False])
    assert [labels[i] for i in path] == ["O", "B-LOC", "I-LOC", "O"]
    assert decode_entities("北京", [(0, 0), (0, 1), (1, 2), (0, 0)], path, labels) == [
        {"text": "北京", "type": "LOC", "start": 0, "end": 2}]
    assert viterbi_bio(scores, labels, valid=[False] * 4) == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="one column per label"):
        viterbi_bio(scores[:, :2], labels)
    with pytest.raises(ValueError, match="not BIO"):
        viterbi_bio(scores, ["O", "PER", "I-PER"])
    with pytest.raises(ValueError, match="valid has 3 entries for 4 tokens"):
        viterbi_bio(scores, labels, valid=[True] * 3)


def test_tag_bigram_prior_counts_training_tags_and_joins_a_name_the_scores_alone_cut():
    import itertools

    import numpy as np

    labels = ["O", "B-PER", "I-PER"]
    # Gold: three-character names; -100 (special tokens) is skipped.
    gold = [[-100, 1, 2, 2, 0, -100], [-100, 0, 1, 2, 2, -100], [-100, 1, 2, 2, -100]]
    prior = count_transitions(gold, labels, smoothing=1.0)
    follow = np.exp(np.array(prior.follow))
    assert np.allclose(follow.sum(axis=1), 1.0) and np.isclose(np.exp(prior.start).sum(), 1.0)
    # From B-PER: 3 x I-PER, 0 x O, 0 x B-PER, plus one smoothing count each -> 4/6, 1/6, 1/6.
    assert follow[1] == pytest.approx([1 / 6, 1 / 6, 4 / 6])
    assert np.exp(prior.start) == pytest.approx([2 / 6, 3 / 6, 1 / 6])  # first tags B, O, B + smoothing
    # 斯大林: the scores alone end the name after 斯 (大 leans O); the prior joins it.
    scores = np.log(np.array([[0.1, 0.8, 0.1], [0.6, 0.05, 0.35], [0.5, 0.05, 0.45]]))
    assert viterbi_bio(scores, labels) == [1, 0, 0]
    assert viterbi_bio(scores, labels, transitions=prior) == [1, 2, 2]
    assert viterbi_bio(scores, labels, transitions=prior.with_weight(0.0)) == viterbi_bio(scores, labels)
    # Brute force: the path maximises emission + weight * (start + follow) among BIO-valid paths.
    rng = np.random.default_rng(1)
    weighted = prior.with_weight(0.7)
    for _ in range(20):
        s = rng.normal(size=(4, 3)) * 2
        logp = s - np.logaddexp.reduce(s, axis=1, keepdims=True)

        def total(p, logp=logp):
            return (logp[np.arange(4), list(p)].sum() + 0.7 * prior.start[p[0]]
                    + 0.7 * sum(prior.follow[a][b] for a, b in zip(p[:-1], p[1:], strict=True)))

        best = max((p for p in itertools.product(range(3), repeat=4) if _bio_valid(p, labels)), key=total)
        assert total(viterbi_bio(s, labels, transitions=weighted)) == pytest.approx(total(best))
    # Round trip through task.json's form, and a table for other labels is refused by name.
    assert TagTransitions.from_dict(weighted.to_dict(), labels).weight == 0.7
    with pytest.raises(ValueError, match="3 start scores .* for 7 labels"):
        TagTransitions.from_dict(weighted.to_dict(), NER_LABELS)
    with pytest.raises(ValueError, match="must hold 'start'"):
        TagTransitions.from_dict({"follow": []}, labels)
    assert TagTransitions.from_task_meta({"labels": labels}, labels) is None  # a model made without one


def test_span_f1_on_hand_made_cases():
    gold = [[(0, 2, "PER"), (5, 7, "LOC")], [(1, 3, "ORG")], []]
    pred = [[(0, 2, "PER"), (5, 8, "LOC")], [{"start": 1, "end": 3, "type": "ORG"}], [(0, 1, "PER")]]
    scores = span_f1(gold, pred)
    assert scores["micro"]["precision"] == pytest.approx(2 / 4)
    assert scores["micro"]["recall"] == pytest.approx(2 / 3)
    assert scores["micro"]["f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert scores["PER"] == {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3), "support": 1}
    assert scores["LOC"]["f1"] == 0.0 and scores["ORG"]["f1"] == 1.0
    assert span_f1([[]], [[]])["micro"]["f1"] == 0.0
    with pytest.raises(ValueError, match="one prediction list per example"):
        span_f1(gold, pred[:2])


# -- LoRA / adapters ----------------------------------------------------------------------------------
def _tiny_classifier(vocab: int = 50):
    torch.manual_seed(0)
    return create(ErnieConfig(vocab_size=vocab, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=2,
                              max_position_embeddings=32, num_labels=3), head="token_classification").eval()


def test_lora_starts_as_the_base_and_merges_back_exactly():
    model = _tiny_classifier()
    ids = torch.randint(5, 50, (3, 12))
    before = model(ids)
    names = apply_lora(model, ["q_proj", "k_proj", "v_proj", "out_proj"], rank=4, alpha=8)
    assert len(names) == 4 * LAYERS
    assert torch.equal(model(ids), before)  # B starts at zero
    for module in model.modules():
        if isinstance(module, LoRALinear):
            torch.nn.init.normal_(module.lora_B, std=0.5)
    adapted = model(ids)
    assert (adapted - before).abs().max() > 1e-2
    assert merge_lora(model) == 4 * LAYERS
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert set(model.state_dict()) == set(_tiny_classifier().state_dict())  # a plain sampan model again
    assert torch.allclose(model(ids), adapted, atol=1e-5)
    with pytest.raises(ValueError, match="no linear layer named"):
        apply_lora(model, ["query"], rank=4, alpha=8)


def test_adapters_start_as_identity_and_wrap_attention_and_ffn_outputs():
    model = _tiny_classifier()
    ids = torch.randint(5, 50, (2, 10))
    before = model(ids)
    names = apply_adapters(model, size=8)
    assert sorted(n.rpartition(".")[2] for n in names) == ["fc2"] * LAYERS + ["out_proj"] * LAYERS
    assert torch.equal(model(ids), before)


def test_config_name_base_is_random_init_with_a_trained_tokenizer_and_lora_freezes_it():
    from sampan.finetune.base import build_task_model, load_base
    from sampan.finetune.task_model import apply_method

    texts = [d.text for d in load_corpus("reviews", "train")[:300]]
    with pytest.warns(UserWarning, match="RANDOM weights"):
        base = load_base("ernie-tiny", texts, vocab_size=600)
    assert base.directory is None and base.config.vocab_size == base.tokenizer.vocab_size <= 600
    small = dataclasses.replace(base, config=base.config.replace(hidden_size=HIDDEN, num_layers=LAYERS, num_heads=2))
    model, report = build_task_model(small, "sentiment_analysis", 2, seed=0, max_length=64)
    assert not report.loaded and "ernie.layers.0.attn.q_proj.weight" in report.initialised
    apply_method(model, "lora", {"lora_targets": ["q_proj", "v_proj"], "lora_rank": 2, "lora_alpha": 4}, report.initialised)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == ({f"ernie.layers.{i}.attn.{m}.lora_{x}" for i in range(LAYERS) for m in ("q_proj", "v_proj")
                          for x in "AB"} | {"ernie.pooler.dense.weight", "ernie.pooler.dense.bias",
                                            "classifier.weight", "classifier.bias"})
    with pytest.raises(FileNotFoundError, match=r"neither a directory, a stored model .* nor a registered config"):
        load_base("ernie-nonexistent", texts)
    with pytest.raises(FileNotFoundError, match="did you mean 'ernie-tiny-zh'"):
        load_base("ernie-tny-zh", texts)


def test_a_store_name_is_the_stored_base():
    """`--model ernie-tiny-zh` (what `sampan hub list` shows) is the shipped pretrained base, not an error."""
    from sampan.finetune.base import load_base
    from sampan.hub import resolve

    base = load_base("ernie-tiny-zh")
    assert base.directory == resolve("ernie-tiny-zh") and base.weights
    assert base.tokenizer.vocab_size <= base.config.vocab_size


# -- training ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["full", "lora", "adapter"])
def test_each_method_lowers_the_dev_loss(runs, name):
    result = runs[name]
    assert result.dev_metrics["loss"] < 0.9 * result.initial_dev_metrics["loss"]
    assert result.metrics["loss"] < 0.9 * result.initial_dev_metrics["loss"]
    assert set(result.metrics) >= {"precision", "recall", "f1", "PER_f1", "LOC_f1", "ORG_f1"}
    assert result.labels == NER_LABELS
    records = [json.loads(line) for line in (result.output_dir / "training" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [12]
    assert not list((result.output_dir / "training").glob("checkpoint-*"))


@pytest.mark.slow
def test_trainable_parameter_counts(runs):
    full, lora, adapter = runs["full"], runs["lora"], runs["adapter"]
    assert full.trainable_parameters == full.total_parameters
    head = HIDDEN * len(NER_LABELS) + len(NER_LABELS)
    assert lora.trainable_parameters == LAYERS * 4 * 8 * (HIDDEN + HIDDEN) + head  # rank 8 on q/k/v/out
    assert lora.total_parameters == full.total_parameters + lora.trainable_parameters - head
    norms = (2 * LAYERS + 1) * 2 * HIDDEN  # two per block + the embedding LayerNorm
    per_adapter = HIDDEN * 64 + 64 + 64 * HIDDEN + HIDDEN
    assert adapter.trainable_parameters == LAYERS * 2 * per_adapter + norms + head
    assert lora.trainable_parameters < 0.1 * full.trainable_parameters


@pytest.mark.slow
def test_output_directory_layouts(runs, base_dir):
    merged = runs["lora"].output_dir
    assert {p.name for p in merged.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json", "task.json"}
    meta = json.loads((merged / "task.json").read_text())
    assert meta["task"] == "ner" and meta["labels"] == NER_LABELS and meta["method"] == "lora"
    assert meta["max_length"] == 48 and meta["seed"] == 0 and meta["base_model"] == str(base_dir)
    assert meta["trainable_parameters"] == runs["lora"].trainable_parameters
    assert meta["metrics"]["f1"] == runs["lora"].metrics["f1"]
    small = runs["lora-adapter-layout"].output_dir
    assert not (small / "model.safetensors").exists() and (small / "adapter.safetensors").is_file()
    meta = json.loads((small / "task.json").read_text())
    assert not Path(meta["base_model_dir"]).is_absolute()
    assert (small / meta["base_model_dir"]).resolve() == base_dir.resolve()
    assert (small / "adapter.safetensors").stat().st_size < (merged / "model.safetensors").stat().st_size / 5


@pytest.mark.slow
@pytest.mark.parametrize("method", ["lora", "adapter"])
def test_adapter_layout_loads_equal_to_the_merged_layout(runs, method, base_dir):
    merged, _, meta_m = load_task_model(runs[method].output_dir)
    small, tokenizer, meta_a = load_task_model(runs[f"{method}-adapter-layout"].output_dir)
    assert not merged.training and not small.training
    assert not any(isinstance(m, LoRALinear) for m in list(merged.modules()) + list(small.modules()))
    enc = tokenize_for_task(tokenizer, ["江泽民在北京会见了克林顿总统。", "新华社上海电"], 48)
    ids = torch.full((2, max(len(e.input_ids) for e in enc)), PAD_ID)
    for row, e in enumerate(enc):
        ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids)
    with torch.no_grad():
        assert torch.allclose(merged(ids), small(ids), atol=1e-5)
    assert meta_m["metrics"] == meta_a["metrics"]  # the same run, saved two ways


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adapter", "adapter-adapter-layout", "lora-adapter-layout", "full-embedding-lora"])
def test_every_finetune_output_exports_for_inference(runs, name, tmp_path):
    """`sampan export` takes what `sampan finetune` wrote, whichever method and layout: the graph
    equals the model load_task_model builds (adapter modules kept, LoRA merged)."""
    import numpy as np

    from sampan.inference import Config, create_predictor, export_model_dir

    source = runs[name].output_dir
    out = export_model_dir(source, tmp_path / "export")
    model, tokenizer, _ = load_task_model(source)
    enc = tokenize_for_task(tokenizer, ["江泽民在北京会见了克林顿总统。"], 48)[0]
    ids = np.array([enc.input_ids], dtype=np.int64)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long)).numpy()
    got = create_predictor(Config(out)).run([ids, np.ones_like(ids)])[0]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert "base_model_dir" not in json.loads((out / "task.json").read_text(encoding="utf-8"))
    assert (out / "tokenizer.json").is_file()


@pytest.mark.slow
def test_a_base_with_character_features_goes_from_finetune_to_taskflow(base_dir, tmp_path, monkeypatch, asgi_post):
    """Pinyin / radical / stroke embeddings survive the whole path: fine-tune over a base that
    embeds them (adapter layout), then Taskflow exports it and answers what the eager model does
    with the looked-up feature ids."""
    import shutil

    from sampan.models.pretrained import from_pretrained
    from sampan.taskflow import Taskflow
    from sampan.text import CharFeatures

    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    tokenizer = ChineseTokenizer.load(base_dir / "tokenizer.json")
    features = CharFeatures.build(tokenizer.tokens())
    torch.manual_seed(0)
    base_model = from_pretrained(base_dir)
    config = base_model.config.replace(**features.vocab_sizes())
    with_features = create(config, head="masked_lm")
    with_features.load_state_dict(base_model.state_dict(), strict=False)  # the new feature tables stay random
    base = with_features.save_pretrained(tmp_path / "base-with-features")
    shutil.copyfile(base_dir / "tokenizer.json", base / "tokenizer.json")
    features.save(base / "features.json")
    out = tmp_path / "sentiment-features"
    finetune(small(out, 1e-3, task="sentiment_analysis", model=str(base), method="full", save="adapter",
                   freeze=("ernie.embeddings.word_embeddings",)))
    model, tokenizer, meta = load_task_model(out)
    assert meta["features"] == ["pinyin", "radical", "stroke"]
    texts = ["这家餐厅的服务非常棒", "房间太旧了"]
    flow = Taskflow("sentiment_analysis", task_path=str(out))  # PaddleNLP's name for model=
    enc = tokenize_for_task(tokenizer, texts, 48)
    for text, e, answer in zip(texts, enc, flow(texts), strict=True):
        ids = torch.tensor([e.input_ids])
        with torch.no_grad():
            probs = model(ids, **features.lookup(ids)).softmax(-1)[0]
        assert answer["text"] == text and answer["label"] == meta["labels"][int(probs.argmax())]
        assert answer["score"] == pytest.approx(float(probs.max()), abs=1e-3)

    # served the way `sampan serve --task sentiment_analysis --task-option sentiment_analysis.model=DIR`
    # builds it: the same answers over HTTP
    from sampan.serving import create_app

    app = create_app(tasks=["sentiment_analysis"], task_options={"sentiment_analysis": {"model": str(out)}})
    response = asgi_post(app, "/v1/tasks/sentiment_analysis", {"inputs": texts})
    assert response.status_code == 200, response.text
    assert response.json()["outputs"] == flow(texts)


@pytest.mark.slow
def test_full_finetune_with_frozen_embeddings_saves_only_what_trained(runs, base_dir):
    """freeze + save='adapter': a full fine-tune stored as the tensors that moved, over the base."""
    from safetensors.torch import load_file

    result = runs["full-frozen-embeddings"]
    assert result.dev_metrics["loss"] < 0.9 * result.initial_dev_metrics["loss"]
    saved = load_file(str(result.output_dir / "adapter.safetensors"))
    base = load_file(str(base_dir / "model.safetensors"))
    word = "ernie.embeddings.word_embeddings.weight"
    assert word not in saved and "classifier.weight" in saved
    assert "ernie.layers.1.mlp.fc2.weight" in saved and "ernie.embeddings.position_embeddings.weight" in saved
    assert result.trainable_parameters == result.total_parameters - base[word].numel()
    model, _, meta = load_task_model(result.output_dir)
    params = dict(model.named_parameters())
    assert torch.equal(params[word], base[word])  # held at the base's values
    for name, tensor in saved.items():
        assert torch.equal(params[name], tensor), name
    moved = "ernie.layers.0.attn.q_proj.weight"
    assert not torch.allclose(params[moved], base[moved])
    assert meta["freeze"] == ["ernie.embeddings.word_embeddings"] and meta["method"] == "full"


def test_embedding_lora_starts_as_the_table_trains_only_looked_up_rows_and_merges_exactly():
    model = _tiny_classifier()
    ids = torch.randint(5, 50, (3, 12))
    before = model(ids)
    table = model.ernie.embeddings.word_embeddings.weight.detach().clone()
    assert apply_embedding_lora(model, rank=4, alpha=8) == "ernie.embeddings.word_embeddings"
    lora = model.ernie.embeddings.word_embeddings
    assert isinstance(lora, LoRAEmbedding) and lora.lora_A.shape == (50, 4) and lora.lora_B.shape == (HIDDEN, 4)
    assert torch.equal(model(ids), before)  # A starts at zero
    model(ids).sum().backward()
    unused = sorted(set(range(50)) - set(ids.flatten().tolist()))
    assert lora.lora_A.grad[unused].abs().max() == 0 and lora.lora_A.grad.abs().max() > 0
    with torch.no_grad():
        torch.nn.init.normal_(lora.lora_A, std=0.5)
    adapted = model(ids)
    assert (adapted - before).abs().max() > 1e-2
    assert merge_lora(model) == 1
    merged = model.ernie.embeddings.word_embeddings
    assert type(merged) is torch.nn.Embedding and not torch.equal(merged.weight, table)
    assert set(model.state_dict()) == set(_tiny_classifier().state_dict())
    assert torch.allclose(model(ids), adapted, atol=1e-5)
    with pytest.raises(ValueError, match="not an nn.Embedding"):
        apply_embedding_lora(model, rank=4, alpha=8, target="ernie.layers.0.attn.q_proj")


@pytest.mark.slow
def test_full_finetune_with_embedding_lora_saves_the_update_not_the_table(runs, base_dir):
    from safetensors.torch import load_file

    result, frozen = runs["full-embedding-lora"], runs["full-frozen-embeddings"]
    word = "ernie.embeddings.word_embeddings"
    saved = load_file(str(result.output_dir / "adapter.safetensors"))
    assert f"{word}.weight" not in saved and {f"{word}.lora_A", f"{word}.lora_B"} <= set(saved)
    vocab = load_file(str(base_dir / "model.safetensors"))[f"{word}.weight"].shape[0]
    assert result.trainable_parameters == frozen.trainable_parameters + 4 * (vocab + HIDDEN)
    assert result.dev_metrics["loss"] < 0.9 * result.initial_dev_metrics["loss"]
    model, _, meta = load_task_model(result.output_dir)
    assert meta["method_args"] == {"embedding_lora_rank": 4, "embedding_lora_alpha": 8.0}
    table = dict(model.named_parameters())[f"{word}.weight"]
    assert type(model.ernie.embeddings.word_embeddings) is torch.nn.Embedding  # merged on load
    expected = load_file(str(base_dir / "model.safetensors"))[f"{word}.weight"] + (
        saved[f"{word}.lora_A"] @ saved[f"{word}.lora_B"].T) * (8.0 / 4)
    assert torch.allclose(table, expected, atol=1e-6)
    with pytest.raises(ValueError, match="trains whole under method='full'"):
        FinetuneConfig(task="ner", model=str(base_dir), embedding_lora_rank=4)


def test_mention_replacement_moves_offsets_keeps_types_and_never_copies_held_out_text():
    from sampan.finetune.augment import augment_ner, mention_pool
    from sampan.finetune.data import TaskExample

    train = [TaskExample("a", "江泽民在北京会见克林顿。", entities=((0, 3, "PER"), (4, 6, "LOC"), (8, 11, "PER"))),
             TaskExample("b", "李鹏访问上海浦东。", entities=((0, 2, "PER"), (4, 8, "LOC"))),
             TaskExample("c", "今天天气很好。")]
    assert mention_pool(train) == {"PER": ["江泽民", "克林顿", "李鹏"], "LOC": ["北京", "上海浦东"]}
    extra = augment_ner(train, copies=3, max_chars=30, seed=0)
    assert extra and all(ex.id.startswith(("a#mr", "b#mr")) for ex in extra)
    pool = mention_pool(train)
    for ex in extra:
        assert ex.text not in {t.text for t in train}
        source = next(t for t in train if ex.id.startswith(t.id + "#"))
        assert [k for _, _, k in ex.entities] == [k for _, _, k in source.entities]
        for start, end, kind in ex.entities:
            assert ex.text[start:end] in pool[kind]
        # the text between the entities is the source's
        assert ex.text.endswith(source.text[source.entities[-1][1]:])
    assert augment_ner(train, copies=3, max_chars=9, seed=0) == [e for e in extra if len(e.text) <= 9]
    held = {ex.text for ex in extra}
    assert not augment_ner(train, copies=3, max_chars=30, seed=0, held_out_texts=held)
    assert augment_ner(train, copies=0, max_chars=30, seed=0) == []
    people = augment_ner(train, copies=2, max_chars=30, seed=0, types=("PER",))
    for ex in people:  # only PER is swapped: the places stay where and what they were
        source = next(t for t in train if ex.id.startswith(t.id + "#"))
        assert [ex.text[s:e] for s, e, k in ex.entities if k == "LOC"] == \
            [source.text[s:e] for s, e, k in source.entities if k == "LOC"]
    with pytest.raises(ValueError, match="task='ner' only"):
        FinetuneConfig(task="sentiment_analysis", augment_mentions=1)


def test_gazetteer_names_join_the_replacement_pool_and_bad_files_name_their_line(tmp_path):
    from sampan.finetune.augment import augment_ner
    from sampan.finetune.data import TaskExample
    from sampan.finetune.gazetteer import jieba_gazetteer, load_gazetteer

    names = jieba_gazetteer()  # jieba's own dictionary, filtered by the names' endings
    assert {"浙江大学", "中国人民银行", "新华社"} <= set(names["ORG"]) and "美发师" not in names["ORG"]
    assert {"福州市", "颐和园"} <= set(names["LOC"]) and "平平安安" not in names["LOC"]
    assert 2_000 < len(names["ORG"]) < 5_000 and 5_000 < len(names["LOC"]) < 10_000
    mine = tmp_path / "names.tsv"
    mine.write_text("# my companies\n拼多多\tORG\n\n前海石公园\tLOC\n", encoding="utf-8")
    merged = load_gazetteer(["jieba", str(mine)], ["PER", "LOC", "ORG"])
    assert merged["ORG"][-1] == "拼多多" and merged["LOC"][-1] == "前海石公园" and "PER" not in merged

    train = [TaskExample("a", "新华社记者在北京报道。", entities=((0, 3, "ORG"), (6, 8, "LOC")))]
    extra = augment_ner(train, copies=20, max_chars=40, seed=0, gazetteer={"ORG": ["拼多多"], "LOC": ["深圳湾"]})
    swapped = {ex.text[s:e] for ex in extra for s, e, k in ex.entities}
    assert {"拼多多", "深圳湾"} <= swapped  # drawn beside the split's own 新华社 / 北京
    assert all(ex.text.endswith("报道。") and ex.text[ex.entities[0][1]:].startswith("记者在") for ex in extra)

    bad = tmp_path / "bad.tsv"
    bad.write_text("拼多多\tORG\n字节跳动 ORG\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected 'mention<TAB>TYPE'"):
        load_gazetteer([str(bad)], ["ORG"])
    bad.write_text("拼多多\tCOMPANY\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.tsv:1: type 'COMPANY' is not one of"):
        load_gazetteer([str(bad)], ["PER", "LOC", "ORG"])
    with pytest.raises(FileNotFoundError, match="give 'jieba' or a file"):
        load_gazetteer([str(tmp_path / "missing.tsv")], ["ORG"])
    with pytest.raises(ValueError, match="needs augment_mentions > 0"):
        FinetuneConfig(task="ner", augment_gazetteer="jieba")
    with pytest.raises(ValueError, match="names no file .*missing.tsv.*: give 'jieba'"):
        FinetuneConfig(task="ner", augment_mentions=1, augment_gazetteer=("jieba", str(tmp_path / "missing.tsv")))


def test_freeze_holds_base_parameters_while_what_a_method_inserts_trains():
    from sampan.finetune.task_model import apply_method

    model = _tiny_classifier()
    apply_method(model, "adapter", {"adapter_size": 4, "embedding_lora_rank": 2, "embedding_lora_alpha": 4.0}, [],
                 freeze=("ernie.layers.0.", "ernie.embeddings."))
    grad = {n: p.requires_grad for n, p in model.named_parameters()}
    assert grad["ernie.embeddings.word_embeddings.lora_A"] and grad["ernie.embeddings.word_embeddings.lora_B"]
    assert not grad["ernie.embeddings.word_embeddings.weight"]
    layer0_adapters = [n for n in grad if n.startswith("ernie.layers.0.") and ".adapter." in n]
    assert layer0_adapters and all(grad[n] for n in layer0_adapters)
    assert not any(grad[n] for n in grad if n.startswith("ernie.layers.0.") and ".adapter." not in n)
    assert any(grad[n] for n in grad if n.startswith("ernie.layers.1.") and "norm" in n)  # adapters train norms


def test_mean_pooling_and_dropout_are_stored_and_reloaded(base_dir, tmp_path):
    """A sentiment fine-tune with a mean-pooled head and dropout: task.json records the config
    fields it changed, and the adapter layout rebuilds the same model from its base."""
    from sampan.finetune.encoding import PadCollator, encode_examples
    from sampan.finetune.evaluate import predict_logits

    cfg = small(tmp_path / "s", 1e-3, task="sentiment_analysis", model=str(base_dir), pooling="mean", dropout=0.1,
                save="adapter", freeze=("ernie.embeddings.word_embeddings",))
    assert cfg.config_overrides() == {"classifier_pooling": "mean", "dropout": 0.1, "attention_dropout": 0.1}
    result = finetune(cfg)
    model, tokenizer, meta = load_task_model(result.output_dir)
    assert meta["config_overrides"] == cfg.config_overrides()
    assert model.config.classifier_pooling == "mean" and model.ernie.pooler is None and not model.training
    data = load_task_data("sentiment_analysis", max_train_examples=8, max_eval_examples=16)
    encoded = encode_examples(tokenizer, data.test, "sentiment_analysis", data.labels, 48)
    first, _ = predict_logits(model, encoded, PadCollator())
    again, _ = predict_logits(load_task_model(result.output_dir)[0], encoded, PadCollator())
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # eval mode: no dropout
    with pytest.raises(ValueError, match="pooling .*applies to task='sentiment_analysis' only"):
        FinetuneConfig(task="ner", pooling="mean")
    with pytest.raises(ValueError, match="dropout must be None"):
        FinetuneConfig(dropout=1.5)


@pytest.mark.slow
def test_freeze_prefix_that_names_nothing_is_an_error(base_dir, tmp_path):
    cfg = small(tmp_path / "out", task="ner", model=str(base_dir), freeze="ernie.embedings")
    with pytest.raises(ValueError, match=r"freeze prefixes \['ernie.embedings'\] name no parameter"):
        finetune(cfg)


@pytest.mark.slow
def test_lora_merged_model_loads_with_plain_from_pretrained(runs):
    from sampan.models import from_pretrained

    model = from_pretrained(runs["lora"].output_dir)
    assert type(model).__name__ == "ErnieForTokenClassification" and model.config.num_labels == len(NER_LABELS)


# -- user data, errors, CLI --------------------------------------------------------------------------------
def _write_reviews(path: Path, n: int = 300) -> None:
    reviews = load_corpus("reviews", "train")[:n]
    path.write_text("".join(json.dumps({"text": d.text, "label": d.label}, ensure_ascii=False) + "\n"
                            for d in reviews), encoding="utf-8")


def test_user_jsonl_sentiment_data(base_dir, tmp_path):
    data_file = tmp_path / "reviews.jsonl"
    _write_reviews(data_file)
    result = finetune(FinetuneConfig(task="sentiment_analysis", model=str(base_dir), data=str(data_file),
                                     method="lora", max_length=48,
                                     training={"learning_rate": 3e-3, "output_dir": str(tmp_path / "out"),
                                               "max_steps": 6, "per_device_train_batch_size": 16}))
    assert result.labels == ["neg", "pos"]
    assert sum(result.data_sizes.values()) == 300
    assert 0.0 <= result.metrics["accuracy"] <= 1.0 and result.metrics["examples"] == result.data_sizes["test"]
    model, _, meta = load_task_model(result.output_dir)
    assert meta["labels"] == ["neg", "pos"] and model.config.num_labels == 2
    with pytest.raises(ValueError, match="not empty"):
        finetune(FinetuneConfig(task="sentiment_analysis", model=str(base_dir), data=str(data_file),
                                training={"output_dir": str(tmp_path / "out")}))


def test_malformed_jsonl_lines_name_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "很好", "label": "pos"}\n\n{"text": "很差", "label": "neg"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:3: not valid JSON"):
        read_jsonl(bad, "sentiment_analysis", 126)
    bad.write_text('{"text": "王小明在北京", "entities": [[0, 3, "PER"], [2, 6, "LOC"]]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: entities overlap"):
        read_jsonl(bad, "ner", 126)
    bad.write_text('{"text": "王小明", "entities": [[0, 9, "PER"]]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: entity .* outside the text"):
        read_jsonl(bad, "ner", 126)
    bad.write_text('{"text": "王小明", "label": null}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: 'label' must be"):
        read_jsonl(bad, "sentiment_analysis", 126)


def test_config_validation():
    with pytest.raises(ValueError, match="FinetuneConfig.method"):
        FinetuneConfig(method="prefix")
    with pytest.raises(ValueError, match="save='adapter'"):
        FinetuneConfig(method="full", save="adapter")
    assert FinetuneConfig(method="full", save="adapter", freeze="a.b, c").freeze == ("a.b", "c")
    with pytest.raises(ValueError, match="TrainingArguments.warmup_ratio must be a fraction"):
        FinetuneConfig(training={"warmup_ratio": 5})
    with pytest.raises(ValueError, match="training.strategy is not used by a fine-tune"):
        FinetuneConfig(training={"strategy": {"hybrid_configs": {"dp_degree": 2}}})


def test_cli_finetune_end_to_end(base_dir, tmp_path, capsys):
    from sampan.cli import main

    out = tmp_path / "sentiment"
    code = main(["finetune", "--task", "sentiment_analysis", "--model", str(base_dir), "--method", "adapter",
                 "--output-dir", str(out), "--steps", "6", "--batch-size", "16", "--learning-rate", "3e-3",
                 "--max-length", "48", "--max-train-examples", "200", "--max-eval-examples", "64"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "accuracy" in printed and "trainable parameters" in printed
    model, tokenizer, meta = load_task_model(out)
    assert meta["labels"] == ["negative", "positive"] and meta["method"] == "adapter"
    assert meta["data_sizes"] == {"train": 200, "dev": 64, "test": 64}
    assert main(["finetune", "--task", "ner", "--model", str(base_dir), "--output-dir", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["finetune", "--help"])
    assert exit_info.value.code == 0
    usage = capsys.readouterr().out
    assert all(flag in usage for flag in ("--method", "--lora-rank", "--save", "--max-train-examples",
                                          "--training.lr_scheduler", "--steps", "--epochs"))


@pytest.mark.slow
def test_cli_finetune_ner_with_embedding_lora_and_mention_replacement(base_dir, tmp_path, capsys):
    from sampan.cli import main

    out = tmp_path / "ner"
    code = main(["finetune", "--task", "ner", "--model", str(base_dir), "--output-dir", str(out), "--steps", "6",
                 "--batch-size", "16", "--learning-rate", "1e-3", "--max-length", "48", "--max-train-examples", "200",
                 "--max-eval-examples", "32", "--freeze", "ernie.embeddings.word_embeddings", "--save", "adapter",
                 "--embedding-lora-rank", "4", "--augment-mentions", "1", "--augment-types", "PER"])
    assert code == 0
    printed = capsys.readouterr().out
    added = int(printed.split("mention replacement: ")[1].split(" augmented")[0].replace(",", ""))
    _, _, meta = load_task_model(out)
    assert 0 < added <= 200 and meta["data_sizes"]["train"] == 200 + added
    assert meta["augment_mentions"] == 1 and meta["augment_types"] == ["PER"]
    assert meta["method_args"]["embedding_lora_rank"] == 4
    # The tag-bigram prior: its weight was picked among the tried ones by dev F1, and the test
    # figures without it are kept beside the ones with it.
    prior = TagTransitions.from_task_meta(meta, meta["labels"])
    search = {float(w): f1 for w, f1 in meta["tag_transition_search"].items()}
    assert prior.weight in search and search[prior.weight] == max(search.values())
    assert meta["dev_metrics"]["f1"] == pytest.approx(search[prior.weight], abs=1e-6)
    assert set(meta["metrics_without_transitions"]) == set(meta["metrics"])
    assert "tag-bigram prior, dev F1 by weight" in printed

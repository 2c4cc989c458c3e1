"""The model store: lookup order, cards, errors, atomic builds, and a real (tiny) recipe run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import sampan.hub as hub
from sampan.hub import recipes
from sampan.store.models import SHIPPED_DIR, ModelNotFoundError, resolve

SHIPPED = ("ernie-tiny-zh", "ernie-mini-zh", "ernie-mini-sentiment", "ernie-tiny-ner", "gpt-zh", "chat-zh-tiny",
           "ocr-det-zh", "ocr-rec-zh")
INT8 = {"ernie-mini-zh", "ernie-mini-sentiment"}  # stored int8 row-wise (sampan.models.weight_files.quantize_file)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    return tmp_path


def test_shipped_models_are_complete_fp16_or_int8_and_within_budget(home):
    from sampan.models.weight_files import INT8_ROWWISE, QUANT_KEY

    total = 0
    for name in SHIPPED:
        path = resolve(name)
        assert path == (SHIPPED_DIR / name).resolve()
        card = json.loads((path / "card.json").read_text(encoding="utf-8"))
        assert card["name"] == name and card["recipe"] == name and card["metrics"]
        for f in path.iterdir():
            total += f.stat().st_size
        weights = [f for f in path.iterdir() if f.suffix == ".safetensors"]
        assert weights, name
        for w in weights:
            with safe_open(str(w), framework="pt") as f:
                dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
                quantized = (f.metadata() or {}).get(QUANT_KEY) == INT8_ROWWISE
            # the n-gram half beside a sentiment adapter is two vectors: nothing to quantize row-wise
            assert quantized == (name in INT8 and w.name != "ngram.safetensors"), (w, quantized)
            assert dtypes <= ({"F16", "I64", "I8"} if quantized else {"F16", "I64"}), (w, dtypes)
    # 30 MB for the four ERNIE / GPT models, + 6 MB for chat-zh-tiny (a 2.9M-parameter Llama in fp16,
    # 5.6 MB, and its own 67 KB tokenizer with the chat template), + 4 MB for OCR (ocr-det-zh 0.7 MB,
    # ocr-rec-zh 2.5 MB with its 6.6K-character charset, both fp16): 39.1 MB; + ernie-mini-zh (13.5M
    # parameters: 27 MB in fp16, 14 MB int8 row-wise). Issue 39 lets the store grow to 60 MB for a
    # stronger base; int8 keeps room for the layout detector and a fine-tune of the new base:
    # ernie-mini-sentiment, 9.6 MB with its adapter int8 (18 MB fp16), in place of ernie-tiny-sentiment's 5.4 MB.
    assert total <= 60 * 2**20, f"shipped models take {total / 2**20:.1f} MB, over the 60 MB budget"


def test_user_builds_override_shipped_models(home):
    user = home / "models" / "gpt-zh"
    user.mkdir(parents=True)
    (user / "card.json").write_text(json.dumps({"name": "gpt-zh", "task": "text_generation"}), encoding="utf-8")
    assert resolve("gpt-zh") == user.resolve()
    listed = {m["name"]: m["path"] for m in hub.list()["models"]}
    assert listed["gpt-zh"] == str(user.resolve())
    assert set(SHIPPED) <= set(listed)


def test_hub_list_shows_each_cards_scores_and_json_every_figure(home, capsys):
    """The table row keeps a card's scores (F1, accuracy, perplexity) and drops losses, supports
    and precision / recall parts; ``--json`` keeps every figure."""
    from sampan.cli import main as cli_main
    from sampan.commands.hub import headline_metrics

    ner = json.loads((SHIPPED_DIR / "ernie-tiny-ner" / "card.json").read_text(encoding="utf-8"))["metrics"]
    shown = headline_metrics(ner)
    assert shown.startswith(f"test_f1={ner['test_f1']:.3g}") and "test_PER_f1=" in shown and "test_LOC_f1=" in shown
    assert "loss" not in shown and "support" not in shown and "precision" not in shown and "parameters" not in shown
    assert cli_main(["hub", "list", "--json"]) == 0
    listed = {m["name"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    assert listed["ernie-tiny-ner"]["metrics"] == ner  # every figure, the losses included


def test_hub_list_table_fits_80_columns_without_cutting_names_or_figures(home, capsys, monkeypatch):
    """What a reader copies from the table (a model's name) or compares (its figures) is whole in
    an 80-column terminal: nothing is cut with an ellipsis or folded across lines."""
    from sampan.cli import main as cli_main
    from sampan.commands.hub import headline_metrics

    monkeypatch.setenv("COLUMNS", "80")
    assert cli_main(["hub", "list"]) == 0
    table = capsys.readouterr().out
    assert max(len(line) for line in table.splitlines()) <= 80 and "…" not in table
    for card in SHIPPED_DIR.glob("*/card.json"):
        model = json.loads(card.read_text(encoding="utf-8"))
        row = next(line for line in table.splitlines() if line.split() and line.split()[0] == model["name"])
        assert model["task"] in row.split() and "shipped" in row.split()
        for figure in headline_metrics(model["metrics"], "\n", short=True).splitlines():
            assert figure in table.split(), (figure, table)


def test_missing_models_name_the_command_that_builds_them(home, monkeypatch):
    monkeypatch.setattr("sampan.store.models.SHIPPED_DIR", home / "nothing-shipped")
    with pytest.raises(ModelNotFoundError, match="sampan hub build gpt-zh"):
        resolve("gpt-zh")
    with pytest.raises(ModelNotFoundError, match="unknown model 'gpt-9'; did you mean 'gpt-zh'\\? known models:"):
        resolve("gpt-9")
    with pytest.raises(ModelNotFoundError, match="unknown model 'bert-base-uncased'; known models:"):
        resolve("bert-base-uncased")  # nothing close: no guess
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve("./no/such/dir")


def test_the_store_names_exactly_the_recipes():
    """sampan.store owns the buildable names (so an unbuilt one's error says how to build it
    without importing the recipes); the recipes must register exactly those."""
    from sampan.store.models import RECIPE_NAMES

    assert sorted(RECIPE_NAMES) == sorted(recipes.RECIPES)


def test_recipe_settings_are_typed_and_checked():
    s = recipes.parse_settings(recipes.GPTRecipe, ["training.max_steps=5", "training.learning_rate=0.01",
                                                   "data.corpora=news", "model.overrides.hidden_size=32"])
    assert (s.training.max_steps, s.training.learning_rate, s.data.corpora) == (5, 0.01, ("news",))
    assert s.model.overrides == {"hidden_size": 32, "num_layers": 4, "num_heads": 4}  # the recipe's others kept
    with pytest.raises(ValueError, match=r"'training.max_stepz=5': did you mean 'training.max_steps'\? expected "
                                         "KEY=VALUE with KEY a field of GPTRecipe: data.\\*, eval_windows"):
        recipes.parse_settings(recipes.GPTRecipe, ["training.max_stepz=5"])
    # the flat keys these settings had before they nested the verbs' configs name their new place
    with pytest.raises(ValueError, match=r"steps is now training.max_steps \(--set training.max_steps=5\)"):
        recipes.parse_settings(recipes.GPTRecipe, ["steps=5"])
    with pytest.raises(ValueError, match="training.max_steps takes an integer, e.g. training.max_steps=1000"):
        recipes.parse_settings(recipes.GPTRecipe, ["training.max_steps=2.5"])  # was cut to 2 without a word
    with pytest.raises(ValueError, match="training.learning_rate takes a number"):
        recipes.parse_settings(recipes.GPTRecipe, ["training.learning_rate=fast"])
    with pytest.raises(ValueError, match=r"training.output_dir is set by the recipe \(\$SAMPAN_HOME/build/gpt-zh\)"):
        recipes.parse_settings(recipes.GPTRecipe, ["training.output_dir=/tmp/x"])
    assert recipes.parse_settings(recipes.GPTRecipe, ["training.max_steps=1e3"]).training.max_steps == 1000
    e = recipes.parse_settings(recipes.ErnieRecipe, ["pretrain.pack=false", "pretrain.model.overrides.pre_norm=true",
                                                     "pretrain.model.overrides.dropout=0"])
    assert (e.pretrain.pack, e.pretrain.model.overrides["pre_norm"], e.pretrain.model.overrides["dropout"]) == (
        False, True, 0)  # not bool("false")
    assert recipes.parse_settings(recipes.ErnieRecipe, ["pretrain.pack=no"]).pretrain.pack is False  # every flag's words
    with pytest.raises(ValueError, match="pretrain.pack is true or false"):
        recipes.parse_settings(recipes.ErnieRecipe, ["pretrain.pack=maybe"])
    ner = recipes.parse_settings(recipes.NERRecipe, ["finetune.training.max_steps=30", "finetune.freeze=",
                                                     "finetune.embedding_lora_rank=0", "finetune.save=merged"])
    assert ner.finetune.task == "ner" and ner.finetune.training.max_steps == 30 and ner.finetune.freeze == ()
    with pytest.raises(ValueError, match="embedding_lora_rank=32 adds an update to a table that trains whole"):
        recipes.parse_settings(recipes.NERRecipe, ["finetune.freeze="])  # the config's own checks still run
    with pytest.raises(ValueError, match="no recipe 'bert'; recipes:"):
        recipes.build("bert")
    with pytest.raises(ValueError, match="no recipe 'gpt-zx'; did you mean 'gpt-zh'"):
        recipes.build("gpt-zx")


def test_each_recipe_flag_sets_its_setting():
    """``sampan hub build NAME`` generates its flags from the recipe's settings; ``--set`` is the same."""
    from sampan.cli import build_parser
    from sampan.utils.flags import dataclass_from_args

    args = build_parser().parse_args(["hub", "build", "ernie-tiny-sentiment", "--finetune.training.max_steps", "30",
                                      "--finetune.method", "lora", "--set", "finetune.lora_rank=4"])
    settings = dataclass_from_args(recipes.SentimentRecipe, args)
    assert (settings.finetune.training.max_steps, settings.finetune.method) == (30, "lora")
    assert getattr(args, "changes.set") == ["finetune.lora_rank=4"]
    assert settings.finetune.training.learning_rate == 3e-4  # the recipe's default, not finetune's


def test_a_failed_build_leaves_nothing_behind(home, monkeypatch):
    def broken(settings, out, log):
        (out / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("out of memory at step 7")

    monkeypatch.setitem(recipes.RECIPES, "broken", recipes.Recipe("broken", "fill_mask", "", recipes.GPTRecipe,
                                                                   broken))
    with pytest.raises(RuntimeError, match="step 7"):
        recipes.build("broken", out_root=home / "models")
    assert list((home / "models").iterdir()) == []


@pytest.mark.slow
def test_gpt_recipe_builds_a_usable_seeded_model(home, poetry_corpus):
    """A tiny real run of the gpt-zh recipe: data build (news + 三国演义, and Tang poems with the
    same tokenizer), training, fp16 store, card; the same settings give the same bytes; Taskflow
    runs the result through the predictor."""
    import shutil

    settings = ["data.corpora=news,sanguo", "data.max_docs=12", "data.vocab_size=600", "data.seq_len=32",
                "training.max_steps=3", "training.per_device_train_batch_size=2", "model.overrides.hidden_size=32",
                "model.overrides.num_layers=1", "model.overrides.num_heads=2", "training.warmup_steps=1"]
    cmd = [sys.executable, "-m", "sampan.cli", "hub", "build", "gpt-zh", "--eval-windows", "4", "--poetry-docs", "6",
           "--poetry-test-docs", "2"] + [a for s in settings for a in ("--set", s)]
    env = {**__import__("os").environ, "SAMPAN_HOME": str(home)}
    missing = subprocess.run(cmd, env=env, timeout=600, capture_output=True, text=True)
    assert missing.returncode != 0 and "run `sampan data fetch poetry` first" in missing.stderr
    assert not (home / "build").exists()  # refused before the data build, not after it
    shutil.copytree(poetry_corpus, home / "corpora" / poetry_corpus.name)
    subprocess.run(cmd, check=True, env=env, timeout=600, capture_output=True)
    built = home / "models" / "gpt-zh"
    card = json.loads((built / "card.json").read_text(encoding="utf-8"))
    assert card["settings"]["training"]["max_steps"] == 3 and card["settings"]["model"]["overrides"]["hidden_size"] == 32
    assert card["settings"]["poetry_docs"] == 6
    assert card["metrics"]["heldout_loss"] > 0 and card["metrics"]["heldout_poetry_loss"] > 0
    builds = {p.name.split("-")[1]: p for p in (home / "build").iterdir() if p.name.startswith("data-")}
    assert set(builds) == {"news+sanguo", "poetry"}  # the poems are tokenized with the shared tokenizer
    assert (builds["poetry"] / "tokenizer.json").read_bytes() == (builds["news+sanguo"] / "tokenizer.json").read_bytes()
    first = load_file(str(built / "model.safetensors"))
    subprocess.run(cmd, check=True, env=env, timeout=600, capture_output=True)
    again = load_file(str(built / "model.safetensors"))
    assert first.keys() == again.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    out = subprocess.run([sys.executable, "-m", "sampan.cli", "task", "text_generation", "话说", "--model", "gpt-zh"],
                         check=True, env=env, timeout=600, capture_output=True, text=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["text"] == "话说" and isinstance(row["generated"], str)


@pytest.mark.slow
def test_hub_evaluate_rescores_a_task_model_and_bio_decoding_beats_argmax(home):
    """``sampan hub evaluate`` re-runs the recipe's test scoring on stored weights; on the shipped NER
    model, BIO-constrained decoding scores higher span F1 than per-token arg-max on the same logits,
    and the tag-bigram prior in its task.json (which evaluate decodes with) higher still."""
    import shutil

    from sampan.finetune import (
        decode_entities,
        encode_examples,
        load_task_data,
        load_task_model,
        predict_logits,
    )
    from sampan.finetune.encoding import PadCollator
    from sampan.finetune.evaluate import score
    from sampan.finetune.metrics import flat_span_metrics, span_f1
    from sampan.hub.evaluate import evaluate_model, write_metrics

    for name in ("ernie-tiny-zh", "ernie-tiny-ner"):  # a writable copy: the NER delta reads ../ernie-tiny-zh
        shutil.copytree(SHIPPED_DIR / name, home / "models" / name)
    metrics = evaluate_model("ernie-tiny-ner", max_examples=200)
    # The shipped model scores 0.831 span F1 on these 200 sentences (0.847 on the whole test split).
    # It was 0.916 before the People's Daily gold got its compound names back (四川大学 one ORG, not
    # LOC 四川; sampan/text/corpus/peoples_daily.py): the model was trained on the word-level gold
    # and still tags the old way (0.924 on the whole split against that gold, its card's test_f1),
    # and the rebuilt windows make these 200 a different sample. This is inference on fixed
    # weights: on one machine it gives the same figure every run. The floor's 0.026 margin is a few
    # entities: room for another CPU's rounding or a rebuild of equal quality.
    assert metrics["examples"] == 200 and 0.805 <= metrics["f1"] <= 1, metrics

    model, tokenizer, meta = load_task_model(home / "models" / "ernie-tiny-ner")
    test = load_task_data("ner", max_eval_examples=200).test
    encoded = encode_examples(tokenizer, test, "ner", meta["labels"], 128)
    logits, _ = predict_logits(model, encoded, PadCollator())
    gold = [list(ex.entities) for ex in test]
    argmax = flat_span_metrics(span_f1(gold, [decode_entities(ex.text, enc.offsets, lg.argmax(-1).tolist(),
                                                              meta["labels"])
                                              for ex, enc, lg in zip(test, encoded, logits, strict=True)]))
    bio = score("ner", test, encoded, logits, meta["labels"])  # Viterbi, no prior
    assert meta["tag_transitions"]["weight"] > 0
    assert metrics["f1"] > bio["f1"] > argmax["f1"], (metrics["f1"], bio["f1"], argmax["f1"])
    # The decoding as shipped gains at least two points: 0.059 on the model over the 1,200-step base,
    # 0.031 on the one over the 4,000-step base, whose tags break BIO less often on their own.
    assert metrics["f1"] > argmax["f1"] + 0.02, (metrics["f1"], argmax["f1"])
    print(f"200 test sentences: arg-max {argmax['f1']:.4f}, BIO {bio['f1']:.4f}, with the prior {metrics['f1']:.4f}")

    card_before = json.loads((home / "models" / "ernie-tiny-ner" / "card.json").read_text(encoding="utf-8"))
    write_metrics("ernie-tiny-ner", metrics)
    card = json.loads((home / "models" / "ernie-tiny-ner" / "card.json").read_text(encoding="utf-8"))
    task = json.loads((home / "models" / "ernie-tiny-ner" / "task.json").read_text(encoding="utf-8"))
    assert card["metrics"]["test_f1"] == round(metrics["f1"], 6) and card["metrics"]["test_examples"] == 200
    assert card["metrics"]["trainable_parameters"] == card_before["metrics"]["trainable_parameters"]
    assert task["metrics"] == metrics
    assert not list((home / "models" / "ernie-tiny-ner").glob(".*"))  # no temporary file left

    cli = [sys.executable, "-m", "sampan.cli", "hub", "evaluate", "ernie-tiny-ner", "--write", "--max-examples", "5"]
    bad = subprocess.run(cli, env={**__import__("os").environ, "SAMPAN_HOME": str(home)}, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and "whole-split" in bad.stderr
    with pytest.raises(ValueError, match="hub evaluate scores"):
        evaluate_model("gpt-zh")


@pytest.mark.slow
def test_chat_recipe_pretrains_fine_tunes_and_scores_both(home, poetry_corpus):
    """A tiny real run of chat-zh-tiny: the instruction set, the Llama's pretraining (with the Tang
    poems), the held-out figures of the base, the chat SFT, the figures after it, and the fp16
    store directory with the chat template. Cost: about 25 s."""
    import shutil

    from sampan.finetune import load_chat_model

    shutil.copytree(poetry_corpus, home / "corpora" / poetry_corpus.name)
    settings = ["pretraining.data.corpora=news,sanguo,reviews", "pretraining.data.max_docs=12",
                "pretraining.data.vocab_size=600", "pretraining.data.seq_len=128", "pretraining.poetry_docs=6",
                "pretraining.poetry_test_docs=2", "pretraining.eval_windows=2", "pretraining.training.max_steps=3",
                "pretraining.training.per_device_train_batch_size=2", "pretraining.training.warmup_steps=1",
                "pretraining.training.eval_steps=0", "pretraining.training.save_steps=0",
                "pretraining.model.overrides.hidden_size=32", "pretraining.model.overrides.num_layers=1",
                "pretraining.model.overrides.num_heads=2", "pretraining.model.overrides.num_kv_heads=2",
                "pretraining.model.overrides.intermediate_size=64", "chat_data.per_task=6",
                "chat_data.held_out_per_task=2", "finetune.max_length=128", "finetune.training.max_steps=2",
                "finetune.training.per_device_train_batch_size=2", "finetune.training.warmup_steps=0",
                "reply_tokens=8"]
    built = recipes.build("chat-zh-tiny", settings, log=lambda m: None, out_root=home / "models")
    assert built == home / "models" / "chat-zh-tiny" and resolve("chat-zh-tiny") == built.resolve()
    card = json.loads((built / "card.json").read_text(encoding="utf-8"))
    assert card["task"] == "chat" and card["settings"]["finetune"]["training"]["max_steps"] == 2
    metrics = card["metrics"]
    for name in ("entity_f1", "sentiment_accuracy", "poem_form_share"):
        assert 0.0 <= metrics[name] <= 1.0 and 0.0 <= metrics[f"base_{name}"] <= 1.0
    assert metrics["heldout_records"] == {"entities": 2, "poem": 2, "sentiment": 2}
    assert metrics["heldout_loss"] > 0 and metrics["sft_dev_loss_after"] > 0
    with safe_open(str(built / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}
    model, tokenizer, _ = load_chat_model(built)
    assert model.config.num_layers == 1 and model.config.max_position_embeddings == 128
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "你好"}], add_generation_prompt=True,
                                           tokenize=False)
    assert prompt == "[CLS]用户：你好[SEP]助手："
    assert sorted(p.name for p in built.iterdir()) == ["card.json", "config.json", "model.safetensors",
                                                      "special_tokens_map.json", "tokenizer.json",
                                                      "tokenizer_config.json"]  # all package data

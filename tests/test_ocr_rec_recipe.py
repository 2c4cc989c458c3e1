"""The ``ocr-rec-zh`` recipe on a tiny setting: it writes a loadable fp16 recogniser whose card holds
the held-out figures, and a rerun after a lost checkpoint resumes from the one before with the same
loss sequence as the uninterrupted run; ``sampan finetune --task ocr_rec`` on 12 labelled rendered
lines; the line-accuracy figures on hand-made strings. Measured cost: 14 s wall (6.5 s of CPU) on
this 2-core machine while three training runs shared it: two tiny builds of 6 steps over 36 lines
rendered once, one 4-step fine-tune of a tiny recogniser."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open

from sampan.hub import recipes
from sampan.vision.rec_ctc import CTCRecognizer
from sampan.vision.rec_metrics import edit_distance, line_accuracy

TINY = ["data.train_lines=24", "data.test_lines=8", "clean_test_lines=4", "data.corpora=sanguo",
        "model.hidden=32", "model.layers=1", "model.heads=2", "model.backbone.stem_channels=8",
        "model.backbone.stage_channels=[16,24,32,32]", "model.backbone.stage_blocks=[1,1,1,1]",
        "training.max_steps=6", "training.per_device_train_batch_size=8", "training.warmup_steps=1",
        "training.logging_steps=1", "training.save_steps=3", "training.eval_steps=3"]


def _losses(run_dir) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_the_recipe_stores_a_scored_fp16_recogniser_and_resumes_the_same_run(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    torch.set_num_threads(1)
    out = recipes.build("ocr-rec-zh", TINY, log=lambda m: None)
    card = json.loads((out / "card.json").read_text(encoding="utf-8"))
    assert card["task"] == "ocr_rec" and card["settings"]["training"]["max_steps"] == 6
    for name in ("clean", "degraded"):
        for figure in ("char_accuracy", "line_accuracy"):
            assert 0.0 <= card["metrics"][f"heldout_{name}_{figure}"] <= 1.0
    assert card["metrics"]["heldout_clean_lines"] == 4 and card["metrics"]["step"] in (3, 6)  # the best eval
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} - {"I64"} == {"F16"}  # I64: BatchNorm's step counts
    model = CTCRecognizer.from_pretrained(out)
    assert model.config.hidden == 32 and model.codec.num_classes == model.config.num_classes
    [read] = model.recognize([torch.full((32, 64, 3), 255, dtype=torch.uint8).numpy()])
    assert isinstance(read.text, str)

    run_dir = tmp_path / "build" / "ocr-rec-zh"
    first = _losses(run_dir)
    assert sorted(first) == [1, 2, 3, 4, 5, 6]
    shutil.rmtree(run_dir / "checkpoint-00000006")  # as if the run had been stopped after step 5
    recipes.build("ocr-rec-zh", TINY, log=lambda m: None)
    again = _losses(run_dir)
    assert sorted(again) == [1, 2, 3, 4, 5, 6]
    assert [again[s] for s in (4, 5, 6)] == pytest.approx([first[s] for s in (4, 5, 6)], rel=1e-5)


def test_export_only_without_an_evaluated_run_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no evaluated model yet"):
        recipes.build("ocr-rec-zh", [*TINY, "export_only=true"], log=lambda m: None)


def test_bad_model_settings_are_refused_before_rendering(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="no field"):
        recipes.build("ocr-rec-zh", [*TINY, "model.hiden=32"], log=lambda m: None)
    with pytest.raises(ValueError, match="num_classes is set by the recipe"):
        recipes.build("ocr-rec-zh", [*TINY, "model.num_classes=9"], log=lambda m: None)
    assert not (tmp_path / "build").exists()


def test_line_accuracy_is_one_minus_the_normalised_edit_distance():
    assert edit_distance("", "abc") == 3 and edit_distance("kitten", "sitting") == 3
    assert edit_distance("天地人", "天人") == 1
    figures = line_accuracy(["天地人", "一二", ""], ["天地人", "一二三", "四"])
    # per line: 0, 1/3 (one missing of the longer 3), 1 (nothing read) -> 1 - 4/9
    assert figures["char_accuracy"] == pytest.approx(1 - (0 + 1 / 3 + 1) / 3)
    assert figures["line_accuracy"] == pytest.approx(1 / 3) and figures["lines"] == 3
    with pytest.raises(ValueError, match="2 predictions for 1"):
        line_accuracy(["a", "b"], ["a"])


def _labelled_lines(tmp_path, texts):
    """Rendered line images and their JSONL labels (image paths relative to the file)."""
    import numpy as np

    from sampan.vision.fonts import installed_fonts
    from sampan.vision.render import render_line

    font = installed_fonts()[0]
    (tmp_path / "lines").mkdir()
    rows = []
    for i, text in enumerate(texts):
        render_line(text, font, 24, np.random.default_rng(i)).image.save(tmp_path / "lines" / f"{i}.png")
        rows.append(json.dumps({"image": f"lines/{i}.png", "text": text}, ensure_ascii=False))
    labels = tmp_path / "labels.jsonl"
    labels.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return labels


def test_finetune_ocr_rec_trains_a_recogniser_on_labelled_lines(tmp_path):
    from sampan.finetune import FinetuneConfig, finetune
    from sampan.vision.rec_ctc import RecognizerConfig

    torch.set_num_threads(1)
    charset = list("一二三四五六七八九十")
    base = tmp_path / "base"
    torch.manual_seed(0)
    CTCRecognizer(RecognizerConfig.tiny(len(charset) + 1), charset).save_pretrained(base)
    texts = ["一二三", "四五六", "七八九", "十一二", "三四五", "六七八", "九十一", "二三四", "五六七", "八九十", "一三五"]
    labels = _labelled_lines(tmp_path, [*texts, "一二X"])  # X is outside the charset: left out
    out = tmp_path / "tuned"
    result = finetune(FinetuneConfig(task="ocr_rec", model=str(base), data=str(labels), dev_fraction=0.2, training={
        "output_dir": str(out), "max_steps": 4, "per_device_train_batch_size": 4, "learning_rate": 1e-3,
        "warmup_ratio": 0.0, "tensorboard": False}))
    assert result.data_sizes == {"train": 9, "dev": 2, "test": 2}  # 11 usable lines, 2 held out as dev (= test)
    assert set(result.metrics) >= {"char_accuracy", "line_accuracy"} and result.dev_metrics["step"] == 4  # evaluated at the end only
    tuned = CTCRecognizer.from_pretrained(out)
    assert tuned.codec.charset == charset and (out / "training" / "metrics.jsonl").is_file()
    assert not torch.equal(tuned.head.weight, CTCRecognizer.from_pretrained(base).head.weight)


def test_finetune_ocr_rec_names_bad_labels(tmp_path):
    from sampan.finetune import FinetuneConfig
    from sampan.finetune.ocr_rec import read_line_labels

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"image": "nowhere.png", "text": "一"}\n', encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=r"bad.jsonl:1: image .*nowhere.png not found"):
        read_line_labels(bad)
    bad.write_text('{"img": "a.png"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: each record is"):
        read_line_labels(bad)
    with pytest.raises(ValueError, match="must be 'full' for task='ocr_rec'"):
        FinetuneConfig(task="ocr_rec", data=str(bad), method="lora")
    with pytest.raises(ValueError, match="JSONL file"):
        FinetuneConfig(task="ocr_rec")

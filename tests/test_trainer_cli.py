"""``sampan train --config``, ``sampan report`` and ``sampan demo`` end to end, on 三国演义 and tiny models."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch

from sampan.cli import main
from sampan.models import from_pretrained

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

RUN_TOML = """\
[model]
name = "gpt-tiny"
hidden_size = 32
num_layers = 1
num_heads = 2
max_position_embeddings = 32

[data]
corpus = "sanguo"
seq_len = 32
eval_chapters = 1

[training]
output_dir = "{out}"
max_steps = 4
per_device_train_batch_size = 2
per_device_eval_batch_size = 64
learning_rate = 0.003
logging_steps = 1
progress_bar = false
seed = 0
"""


def write_run_file(directory: Path, out: Path, extra: str = "", name: str = "run.toml") -> Path:
    path = directory / name
    path.write_text(RUN_TOML.format(out=out.as_posix()) + extra, encoding="utf-8")
    return path


def run_cli(argv: list[str]) -> tuple[int, str]:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(argv)
    return code, stdout.getvalue()


def trailing_json(text: str) -> dict:
    """The JSON object a verb prints last (after any progress lines)."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    return json.loads("\n".join(lines[start:]))


def records(out: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    out = base / "out"
    config = write_run_file(base, out)
    code, stdout = run_cli(["train", "--config", str(config)])
    return {"base": base, "out": out, "config": config, "code": code, "stdout": stdout}


def test_train_from_a_run_file_leaves_everything(trained):
    assert trained["code"] == 0
    out = trained["out"]
    summary = trailing_json(trained["stdout"])
    assert summary["model"] == str(out / "model") and summary["report"] == str(out / "report.png")
    assert summary["steps"] == 4

    train = records(out, "train")
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in train)
    assert summary["first_loss"] == train[0]["loss"] and summary["last_loss"] == train[-1]["loss"]
    evals = records(out, "eval")
    assert [r["step"] for r in evals] == [4]  # eval_steps = 0: once, at the end
    assert summary["last_eval_loss"] == evals[-1]["eval_loss"]

    assert (out / "report.png").read_bytes()[:8] == PNG_SIGNATURE
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-00000004"]
    assert (out / "checkpoint-00000004" / "manifest.json").is_file()

    model_dir = out / "model"
    for name in ("config.json", "model.safetensors", "vocab.json"):
        assert (model_dir / name).is_file(), name
    vocab = json.loads((model_dir / "vocab.json").read_text(encoding="utf-8"))
    assert vocab == json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    model = from_pretrained(model_dir)
    assert (model.config.hidden_size, model.config.num_layers, model.config.max_position_embeddings) == (32, 1, 32)
    assert model.config.vocab_size > 1000  # a character vocabulary of 三国演义
    logits = model(torch.zeros(1, 8, dtype=torch.long))
    assert logits.shape == (1, 8, model.config.vocab_size)


def test_set_overrides_the_run_file(trained, tmp_path):
    out = tmp_path / "override"
    code, stdout = run_cli(["train", "--config", str(trained["config"]), "--set", "training.max_steps=2",
                            "--set", f"training.output_dir={out.as_posix()}", "--set", "training.lr_scheduler=constant",
                            "--set", "training.learning_rate=0.01", "--set", "training.tensorboard=false"])
    assert code == 0
    train = records(out, "train")
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["lr"] == 0.01 for r in train)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-00000002"]
    assert not (out / "tensorboard").exists()
    assert trailing_json(stdout)["steps"] == 2


def test_yaml_run_file_with_a_scientific_learning_rate(tmp_path):
    out = tmp_path / "yaml-run"
    config = tmp_path / "run.yaml"
    config.write_text(
        "model: {name: gpt-tiny, hidden_size: 32, num_layers: 1, num_heads: 2, max_position_embeddings: 32}\n"
        "data: {corpus: sanguo, seq_len: 32, eval_chapters: 0}\n"
        f"training: {{output_dir: '{out.as_posix()}', max_steps: 1, per_device_train_batch_size: 2,\n"
        "           lr_scheduler: constant, learning_rate: 3e-4, tensorboard: false, progress_bar: false}\n",
        encoding="utf-8")
    code, _ = run_cli(["train", "--config", str(config)])
    assert code == 0
    assert records(out, "train")[0]["lr"] == pytest.approx(3e-4)


def test_set_with_a_scientific_learning_rate(trained, tmp_path):
    out = tmp_path / "sci"
    code, _ = run_cli(["train", "--config", str(trained["config"]), "--set", "training.max_steps=1",
                       "--set", f"training.output_dir={out.as_posix()}", "--set", "training.lr_scheduler=constant",
                       "--set", "training.learning_rate=3e-4", "--set", "data.eval_chapters=0"])
    assert code == 0
    assert records(out, "train")[0]["lr"] == pytest.approx(3e-4)


UNKNOWN = {
    "training-key": (lambda text: text + "bogus_knob = 1\n", "bogus_knob"),
    "data-key": (lambda text: text.replace("eval_chapters = 1", "eval_chapters = 1\nchapters = 3"), "chapters"),
    "table": (lambda text: text + "\n[optimizer]\nname = 'adamw'\n", "optimizer"),
}


@pytest.mark.parametrize("case", sorted(UNKNOWN))
def test_unknown_key_or_table_exits_2_naming_it(tmp_path, capsys, case):
    edit, named = UNKNOWN[case]
    out = tmp_path / "never"
    config = tmp_path / "run.toml"
    config.write_text(edit(RUN_TOML.format(out=out.as_posix())), encoding="utf-8")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sampan train: error:")
    assert f"'{named}'" in err
    assert not out.exists()  # rejected before anything ran


def test_unknown_model_key_exits_2_naming_it(tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text(RUN_TOML.format(out=(tmp_path / "o").as_posix()).replace("num_layers = 1", "num_layerz = 1"),
                      encoding="utf-8")
    assert main(["train", "--config", str(config)]) == 2
    assert "'num_layerz'" in capsys.readouterr().err


def test_unknown_set_key_and_malformed_set(trained, capsys):
    config = str(trained["config"])
    assert main(["train", "--config", config, "--set", "training.max_stepz=3"]) == 2
    assert "'max_stepz'" in capsys.readouterr().err
    assert main(["train", "--config", config, "--set", "training.max_steps"]) == 2
    assert "must look like table.key=value" in capsys.readouterr().err
    assert main(["train", "--config", config, "--set", "max_steps=3"]) == 2
    assert "must look like table.key" in capsys.readouterr().err


def test_bad_values_and_missing_file_exit_2(tmp_path, capsys):
    config = write_run_file(tmp_path, tmp_path / "o", "lr_scheduler = 'exponential'\n")
    assert main(["train", "--config", str(config)]) == 2
    assert "TrainingArguments.lr_scheduler" in capsys.readouterr().err
    assert main(["train", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_report_json_summarizes_a_run(trained, tmp_path):
    out = trained["out"]
    png = tmp_path / "curves.png"
    code, stdout = run_cli(["report", str(out), "--json", "--out", str(png)])
    assert code == 0
    summary = json.loads(stdout)
    train = records(out, "train")
    assert summary["report"] == str(png) and png.read_bytes()[:8] == PNG_SIGNATURE
    assert summary["steps"] == 4
    assert summary["first_loss"] == train[0]["loss"]
    assert summary["last_loss"] == train[-1]["loss"]
    assert summary["best_loss"] == min(r["loss"] for r in train)
    assert summary["last_eval_loss"] == records(out, "eval")[-1]["eval_loss"]


def test_report_table_and_missing_run(trained, tmp_path, capsys):
    code, stdout = run_cli(["report", str(trained["out"]), "--out", str(tmp_path / "r.png")])
    assert code == 0
    assert "run summary" in stdout and "first_loss" in stdout and "curves:" in stdout
    assert main(["report", str(tmp_path)]) == 2
    assert "not a Trainer output directory" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_runs_and_leaves_its_evidence(tmp_path):
    out = tmp_path / "demo"
    # Every stage, each at its smallest: the ERNIE stage's build and 8 steps, 2 fine-tuning steps,
    # 4 GPT steps; each stage's settings are its verb's own flags under the stage's name.
    code, stdout = run_cli(["demo", "--ernie.data.max_docs", "20", "--ernie.data.seq_len", "32",
                            "--ernie.pretrain.training.max_steps", "8", "--ernie.pretrain.training.per_device_train_batch_size", "2",
                            "--sentiment.finetune.training.max_steps", "2", "--sentiment.finetune.max_eval_examples",
                            "64", "--sentiment.finetune.training.per_device_train_batch_size", "4",
                            "--gpt.training.max_steps", "4", "--gpt.training.per_device_train_batch_size", "2", "--gpt.data.seq_len",
                            "32", "--gpt.training.eval_steps", "2", "--max-new-tokens", "5", "--out-dir", str(out)])
    assert code == 0
    assert (out / "report.png").read_bytes()[:8] == PNG_SIGNATURE
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    for name in ("config.json", "model.safetensors", "vocab.json"):
        assert (out / "model" / name).is_file(), name
    assert [r["step"] for r in records(out, "eval")] == [2, 4]
    assert records(out, "train")[-1]["step"] == 4
    generated = next(line for line in stdout.splitlines() if line.startswith("generated: "))
    text = generated.removeprefix("generated: ")
    assert text.startswith("话说天下大势，") and len(text) == len("话说天下大势，") + 5
    assert "model saved to" in stdout

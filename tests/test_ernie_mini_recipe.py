"""ernie-mini's shape, ``TrainingArguments.max_minutes`` (one sitting) and the resumable ERNIE recipes.

Cost: about 11 s of CPU, 31 s of wall time on the shared 2-core machine (a tiny data build of 12
People's Daily documents with lexicon entities, a 1-layer, 32-wide ERNIE for 6 steps three times, a
2-layer GPT for 6 steps twice).
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from sampan.hub import recipes
from sampan.io import TokenWindowDataset
from sampan.models import create, get_config
from sampan.trainer import Trainer, TrainingArguments

SEQ, VOCAB = 16, 53


def test_ernie_mini_has_ernie_3_mini_published_size():
    """At ERNIE 3.0 Mini's own vocabulary, positions, segment and task types, the encoder holds the
    26.9M parameters PaddleNLP lists for ernie-3.0-mini-zh (6 layers, 384 wide, 12 heads)."""
    mini = get_config("ernie-mini")
    assert (mini.num_layers, mini.hidden_size, mini.num_heads, mini.intermediate_size) == (6, 384, 12, 1536)
    published = dataclasses.replace(mini, vocab_size=40000, max_position_embeddings=2048, type_vocab_size=4,
                                    task_type_vocab_size=16)
    assert round(published.num_parameters("none") / 1e6, 1) == 26.9


def _gpt_run(tmp_path, name: str, **overrides) -> tuple[Trainer, torch.nn.Module]:
    torch.manual_seed(0)
    model = create("gpt-tiny", vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=SEQ)
    data = TokenWindowDataset(np.random.default_rng(0).integers(0, VOCAB, 2000), seq_len=SEQ)
    args = TrainingArguments(output_dir=str(tmp_path / name), max_steps=6, per_device_train_batch_size=4,
                             learning_rate=1e-3, lr_scheduler="cosine", warmup_steps=2, logging_steps=1, save_steps=0,
                             tensorboard=False, progress_bar=False, peak_flops=0, seed=0, **overrides)
    return Trainer(model, args, data), model


def test_max_minutes_stops_with_a_checkpoint_and_the_resumed_run_matches_one_go(tmp_path):
    straight, straight_model = _gpt_run(tmp_path, "straight")
    assert straight.train().global_step == 6

    # A budget spent by the first step: the sitting ends there, checkpointed, short of max_steps.
    first, _ = _gpt_run(tmp_path, "sittings", max_minutes=1e-9)
    state = first.train()
    assert (state.global_step, state.max_steps) == (1, 6)
    assert [p.name for p in (tmp_path / "sittings").glob("checkpoint-*")] == ["checkpoint-00000001"]

    second, model = _gpt_run(tmp_path, "sittings", resume_from_checkpoint="auto")
    assert second.train().global_step == 6
    # The schedule spanned all 6 steps in both sittings: the same weights as the run in one go.
    for (name, a), b in zip(straight_model.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("overrides, message", [
    ({"max_minutes": -1.0}, "max_minutes must be >= 0"),
    ({"max_minutes": 5.0, "strategy": {"hybrid_configs": {"dp_degree": 1}}}, "not supported with a strategy")])
def test_max_minutes_errors_name_the_problem(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        TrainingArguments(output_dir=str(tmp_path), **overrides)


TINY = ["data.corpora=news", "data.max_docs=12", "data.entities=lexicon", "data.vocab_size=800", "data.seq_len=64",
        "pretrain.model.overrides.num_layers=1", "pretrain.model.overrides.hidden_size=32",
        "pretrain.model.overrides.num_heads=2", "pretrain.model.overrides.intermediate_size=64",
        "pretrain.training.max_steps=6", "pretrain.training.per_device_train_batch_size=4",
        "pretrain.training.warmup_steps=2", "pretrain.training.save_steps=2", "pretrain.training.eval_steps=3",
        "pretrain.training.progress_bar=false", "pretrain.eval_rows=8"]


def test_a_rerun_of_the_recipe_continues_its_run_and_other_settings_get_their_own(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    lines: list[str] = []
    out = tmp_path / "models"
    # The first sitting ends at its budget: checkpointed, nothing stored.
    assert recipes.build("ernie-mini-zh", TINY + ["pretrain.training.max_minutes=1e-9"], lines.append,
                         out_root=out) is None
    assert not (out / "ernie-mini-zh").exists()
    assert any("stopped at step 1 of 6" in line for line in lines)
    run_dirs = list((tmp_path / "build").glob("ernie-mini-zh-*"))
    assert len(run_dirs) == 1 and (run_dirs[0] / "checkpoint-00000001").is_dir()

    # The same settings (another sitting length is still the same run) continue it to the end.
    target = recipes.build("ernie-mini-zh", TINY + ["pretrain.training.max_minutes=30"], lines.append, out_root=out)
    assert "at step 1" in capsys.readouterr().out  # the Trainer's "resumed from ... at step 1"
    card = json.loads((target / "card.json").read_text(encoding="utf-8"))
    assert card["metrics"]["steps"] == 6
    assert 0 < card["metrics"]["heldout_mlm_loss"] < 10
    assert {"heldout_char_mlm_accuracy", "heldout_entity_cloze_accuracy", "parameters"} <= set(card["metrics"])
    assert card["settings"]["pretrain"]["model"]["name"] == "ernie-mini"

    # Other settings never touch that run: they get a work dir of their own.
    recipes.build("ernie-mini-zh", TINY[:-1] + ["pretrain.eval_rows=4", "pretrain.training.max_minutes=1e-9"],
                  lines.append, out_root=out)
    assert len(list((tmp_path / "build").glob("ernie-mini-zh-*"))) == 2
    assert (run_dirs[0] / "checkpoint-00000006").is_dir()

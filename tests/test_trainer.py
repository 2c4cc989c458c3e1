"""The Trainer and its parts: arguments, LR schedules, the step, recompute, AMP, monitoring, reports.

Everything runs on a 2-layer, 32-wide GPT over 32-token windows, so the whole file takes seconds.
The kill-and-resume behaviour lives in ``test_trainer_resume.py``.
"""

from __future__ import annotations

import copy
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import sampan.nn.recompute as recompute_module
from sampan.amp import GradScaler, auto_cast
from sampan.checkpoint import load_checkpoint, resolve_resume
from sampan.io import TokenWindowDataset
from sampan.io.collate import collate_dicts
from sampan.models import create
from sampan.trainer import (
    EvalPrediction,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    apply_recompute,
    load_config_file,
)
from sampan.trainer.report import plot_curves, read_metrics, summarize
from sampan.trainer.schedules import build_schedule
from sampan.utils.hardware import measure_gemm_flops, process_memory_mb

SEQ = 32
VOCAB = 97


# -- helpers ------------------------------------------------------------------------------------
def tiny_gpt(**overrides) -> nn.Module:
    torch.manual_seed(0)
    return create("gpt-tiny", vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2,
                  max_position_embeddings=SEQ, **overrides)


def random_dataset(n_tokens: int = 4000, seed: int = 0) -> TokenWindowDataset:
    return TokenWindowDataset(np.random.default_rng(seed).integers(0, VOCAB, n_tokens), seq_len=SEQ)


def pattern_dataset() -> TokenWindowDataset:
    """A repeating 13-token cycle: perfectly predictable after a few tokens of context."""
    return TokenWindowDataset(np.tile(np.arange(13), 400), seq_len=SEQ)


def make_args(tmp_path: Path, **overrides) -> TrainingArguments:
    base = dict(output_dir=str(tmp_path / "run"), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-3,
                logging_steps=1, save_steps=0, tensorboard=False, progress_bar=False, peak_flops=0, seed=0)
    base.update(overrides)
    return TrainingArguments(**base)


def read_records(output_dir, kind: str = "train") -> list[dict]:
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


class Snapshots(TrainerCallback):
    """Parameters (flattened), schedule position and loss scale after every optimizer step."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.trainer: Trainer | None = None
        self.params: dict[int, torch.Tensor] = {}
        self.sched_epoch: dict[int, int] = {}
        self.scale: dict[int, float] = {}

    def on_train_begin(self, args, state):
        self.params[state.global_step] = flat_params(self.model)
        self.sched_epoch[state.global_step] = self.trainer.schedule.last_epoch

    def on_step_end(self, args, state):
        self.params[state.global_step] = flat_params(self.model)
        self.sched_epoch[state.global_step] = self.trainer.schedule.last_epoch
        self.scale[state.global_step] = self.trainer.scaler.get_scale() if self.trainer.scaler.is_enabled() else None


def snapshot_trainer(model, args, dataset, **kwargs) -> tuple[Trainer, Snapshots]:
    snaps = Snapshots(model)
    trainer = Trainer(model, args, dataset, callbacks=[snaps], **kwargs)
    snaps.trainer = trainer
    return trainer, snaps


class RecordingCollator:
    """The default dict collation, keeping a copy of every batch it built."""

    def __init__(self):
        self.batches: list[dict[str, torch.Tensor]] = []

    def __call__(self, samples):
        batch = collate_dicts(samples)
        self.batches.append({k: v.clone() for k, v in batch.items()})
        return batch


# -- TrainingArguments and config files ---------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("lr_scheduler", "exponential"),
    ("amp", "fp8"),
    ("recompute", "some"),
    ("max_steps", 0),
    ("max_steps", -2),
    ("num_train_epochs", 0),
    ("per_device_train_batch_size", 0),
    ("per_device_eval_batch_size", -1),
    ("gradient_accumulation_steps", 0),
    ("logging_steps", 0),
    ("max_nonfinite_steps", 0),
    ("warmup_steps", -1),
    ("eval_steps", -1),
    ("save_steps", -5),
    ("dataloader_num_workers", -1),
    ("prefetch_factor", 0),
    ("learning_rate", 0.0),
    ("learning_rate", -1e-3),
    ("min_lr_ratio", 1.5),
    ("wsd_decay_ratio", 0.0),
    ("weight_decay", -0.1),
    ("adam_beta1", 1.0),
    ("adam_beta2", -0.1),
    ("adam_epsilon", 0.0),
    ("max_grad_norm", -1.0),
    ("save_total_limit", 0),
    ("peak_flops", -1.0),
    ("output_dir", ""),
])
def test_invalid_argument_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError) as err:
        TrainingArguments(**{field: value})
    message = str(err.value)
    assert f"TrainingArguments.{field} " in message
    assert repr(value) in message


def test_amp_none_string_means_fp32_and_modes_are_kept():
    assert TrainingArguments(amp="none").amp is None
    assert TrainingArguments(amp="").amp is None
    assert TrainingArguments(amp=None).amp is None
    assert TrainingArguments(amp="bf16").amp == "bf16"
    assert TrainingArguments(amp="fp16").amp == "fp16"


def test_from_dict_rejects_unknown_keys_naming_them():
    with pytest.raises(ValueError) as err:
        TrainingArguments.from_dict({"max_steps": 3, "lr": 0.1, "batch_size": 4})
    message = str(err.value)
    assert "['batch_size', 'lr']" in message
    assert "learning_rate" in message  # the allowed keys are listed


def test_to_dict_from_dict_round_trip():
    args = TrainingArguments(max_steps=7, learning_rate=3e-4, amp="bf16", save_total_limit=2, lr_scheduler="wsd")
    again = TrainingArguments.from_dict(json.loads(args.to_json()))
    assert again == args


def test_load_config_file_toml_and_yaml(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('[training]\nmax_steps = 10\nlearning_rate = 0.003\namp = "bf16"\n\n[model]\nname = "gpt-tiny"\n')
    yaml_file = tmp_path / "run.yml"
    yaml_file.write_text("training:\n  max_steps: 10\n  learning_rate: 0.003\n  amp: bf16\nmodel:\n  name: gpt-tiny\n")
    expected = {"training": {"max_steps": 10, "learning_rate": 0.003, "amp": "bf16"}, "model": {"name": "gpt-tiny"}}
    assert load_config_file(toml) == expected
    assert load_config_file(yaml_file) == expected
    yaml_upper = tmp_path / "RUN.YAML"
    yaml_upper.write_text(yaml_file.read_text())
    assert load_config_file(yaml_upper) == expected
    args = TrainingArguments.from_dict(load_config_file(toml)["training"])
    assert (args.max_steps, args.learning_rate, args.amp) == (10, 0.003, "bf16")
    as_json = tmp_path / "run.json"
    as_json.write_text(json.dumps(expected))
    assert load_config_file(as_json) == expected
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config_file(empty) == {}


def test_yaml_scientific_notation_learning_rate_is_a_float(tmp_path):
    # "3e-4" is how everyone writes a learning rate; PyYAML's YAML 1.1 resolver reads it as a string.
    path = tmp_path / "run.yaml"
    path.write_text("training:\n  learning_rate: 3e-4\n  adam_epsilon: 1e-8\n")
    args = TrainingArguments.from_dict(load_config_file(path)["training"])
    assert args.learning_rate == pytest.approx(3e-4)
    assert args.adam_epsilon == pytest.approx(1e-8)


@pytest.mark.parametrize("field, value", [("learning_rate", "fast"), ("max_steps", 2.5), ("max_grad_norm", "1")])
def test_wrongly_typed_argument_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"TrainingArguments.{field}"):
        TrainingArguments(**{field: value})


def test_load_config_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.toml not found"):
        load_config_file(tmp_path / "missing.toml")
    wrong = tmp_path / "run.ini"
    wrong.write_text("[training]\n")
    with pytest.raises(ValueError, match=r"must end in \.toml, \.yaml, \.yml or \.json"):
        load_config_file(wrong)
    broken = tmp_path / "run.toml"
    broken.write_text("[training\n")
    with pytest.raises(ValueError, match=f"config file {broken} is not valid TOML"):
        load_config_file(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="top level"):
        load_config_file(listing)


# -- build_schedule -----------------------------------------------------------------------------
def lr_at(schedule, step: int) -> float:
    schedule.step(step)
    return schedule()


@pytest.mark.parametrize("kind, mid_step, mid_lr", [
    ("linear", 12, 1.0 - 0.9 * 8 / 16),   # halfway through the decay
    ("cosine", 12, 0.1 + 0.9 * 0.5),      # cos(pi / 2): halfway between peak and floor
    ("constant", 12, 1.0),
    ("wsd", 16, 0.1 + 0.9 * (1 - 1 / 5)),  # decay is ceil(0.25 * 20) = 5 steps: 16..20
])
def test_schedule_warmup_peak_and_floor(kind, mid_step, mid_lr):
    args = TrainingArguments(learning_rate=1.0, warmup_steps=4, min_lr_ratio=0.1, lr_scheduler=kind,
                             wsd_decay_ratio=0.25)
    schedule = build_schedule(args, max_steps=20)
    assert schedule() == 0.0  # step 0: warmup starts at 0
    assert lr_at(schedule, 2) == pytest.approx(0.5)
    assert lr_at(schedule, 4) == pytest.approx(1.0)  # end of warmup: the peak
    assert lr_at(schedule, mid_step) == pytest.approx(mid_lr)
    floor = 1.0 if kind == "constant" else 0.1
    assert lr_at(schedule, 20) == pytest.approx(floor)  # on max_steps: learning_rate * min_lr_ratio
    assert lr_at(schedule, 25) == pytest.approx(floor)  # and it stays there
    assert lr_at(schedule, 19) >= floor
    if kind == "wsd":
        assert lr_at(schedule, 15) == pytest.approx(1.0)  # still stable right before the decay


@pytest.mark.parametrize("kind", ["linear", "cosine", "constant", "wsd"])
def test_schedule_without_warmup_starts_at_the_peak(kind):
    args = TrainingArguments(learning_rate=2.0, warmup_steps=0, min_lr_ratio=0.25, lr_scheduler=kind)
    schedule = build_schedule(args, max_steps=10)
    assert schedule() == pytest.approx(2.0)
    assert lr_at(schedule, 10) == pytest.approx(2.0 if kind == "constant" else 0.5)
    values = [lr_at(schedule, s) for s in range(11)]
    assert all(a >= b - 1e-12 for a, b in zip(values, values[1:], strict=False))  # never rises without warmup


def test_schedule_with_warmup_longer_than_the_run():
    args = TrainingArguments(learning_rate=1.0, warmup_steps=50, lr_scheduler="cosine")
    schedule = build_schedule(args, max_steps=10)
    assert lr_at(schedule, 5) == pytest.approx(0.5)
    assert lr_at(schedule, 10) == pytest.approx(1.0)


# -- the training step --------------------------------------------------------------------------
def test_loss_decreases_on_a_learnable_pattern(tmp_path):
    args = make_args(tmp_path, max_steps=30, learning_rate=1e-2)
    state = Trainer(tiny_gpt(), args, pattern_dataset()).train()
    assert state.global_step == 30 and state.skipped_steps == 0
    losses = [r["loss"] for r in read_records(args.output_dir)]
    assert [r["step"] for r in read_records(args.output_dir)] == list(range(1, 31))
    assert losses[0] == pytest.approx(math.log(VOCAB), abs=0.15)  # untrained: close to uniform
    assert np.mean(losses[-3:]) < 0.35 * losses[0]
    assert state.tokens_seen == 30 * 4 * SEQ


def test_max_steps_from_epochs_and_accumulation(tmp_path):
    dataset = random_dataset()  # (4000 - 32) // 32 + 1 = 125 windows
    assert len(dataset) == 125
    args = make_args(tmp_path, max_steps=-1, num_train_epochs=0.5, per_device_train_batch_size=8,
                     gradient_accumulation_steps=2)
    trainer = Trainer(tiny_gpt(), args, dataset)
    # 125 // 8 = 15 batches per epoch (drop_last); half an epoch in steps of 2 micro-batches: ceil(3.75).
    assert trainer.max_steps == 4
    state = trainer.train()
    assert state.global_step == 4 and state.max_steps == 4
    assert state.tokens_seen == 4 * 2 * 8 * SEQ
    assert state.epoch == pytest.approx(8 / 15)
    args2 = make_args(tmp_path / "b", max_steps=-1, num_train_epochs=2, per_device_train_batch_size=4,
                      gradient_accumulation_steps=3)
    assert Trainer(tiny_gpt(), args2, dataset).max_steps == math.ceil(2 * 31 / 3)


def test_too_small_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError) as err:
        Trainer(tiny_gpt(), make_args(tmp_path, per_device_train_batch_size=200), random_dataset())
    assert "125 samples" in str(err.value) and "200" in str(err.value)


def _one_step(tmp_path, name, batch, accumulation, **extra):
    collator = RecordingCollator()
    model = tiny_gpt()
    args = make_args(tmp_path / name, max_steps=1, per_device_train_batch_size=batch,
                     gradient_accumulation_steps=accumulation, max_grad_norm=0.0, weight_decay=0.1, **extra)
    Trainer(model, args, random_dataset(), data_collator=collator).train()
    return model, collator.batches


def test_gradient_accumulation_equals_the_big_batch(tmp_path):
    acc_model, acc_batches = _one_step(tmp_path, "acc", batch=4, accumulation=2)
    big_model, big_batches = _one_step(tmp_path, "big", batch=8, accumulation=1)
    assert len(acc_batches) == 2 and len(big_batches) == 1
    # Shuffling is a function of (seed, epoch): 4 + 4 micro-batches are the 8-sample batch, split.
    merged = {k: torch.cat([b[k] for b in acc_batches]) for k in acc_batches[0]}
    assert torch.equal(merged["input_ids"], big_batches[0]["input_ids"])

    # The same update by hand: one AdamW step on the mean loss of the 8 samples.
    reference = tiny_gpt()
    before = flat_params(reference)
    decay = [p for p in reference.parameters() if p.dim() >= 2]
    no_decay = [p for p in reference.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    reference(**big_batches[0]).backward()
    optimizer.step()
    expected = flat_params(reference)
    assert not torch.allclose(expected, before)
    torch.testing.assert_close(flat_params(acc_model), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(flat_params(big_model), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(flat_params(acc_model), flat_params(big_model), atol=1e-6, rtol=0)


class UnevenMaskCollator(RecordingCollator):
    """MLM batches whose samples hold very different numbers of masked (labelled) tokens."""

    def __call__(self, samples):
        batch = collate_dicts(samples)
        ids = batch["input_ids"]
        # Even samples keep one label; odd ones 8, 15 or 22 (by their first token).
        limit = 1 + 7 * (torch.arange(ids.shape[0]) % 2)[:, None] * (1 + ids[:, :1] % 3)
        keep = torch.arange(ids.shape[1])[None, :] < limit
        batch = {"input_ids": ids, "labels": torch.where(keep, ids, torch.full_like(ids, -100))}
        self.batches.append({k: v.clone() for k, v in batch.items()})
        return batch


def test_accumulation_weights_micro_batches_by_labelled_tokens(tmp_path):
    def tiny_ernie():
        torch.manual_seed(0)
        return create("ernie-tiny", vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2,
                      intermediate_size=64, max_position_embeddings=SEQ, dropout=0.0, attention_dropout=0.0)

    def one_step(name, batch, accumulation):
        collator, model = UnevenMaskCollator(), tiny_ernie()
        args = make_args(tmp_path / name, max_steps=1, per_device_train_batch_size=batch,
                         gradient_accumulation_steps=accumulation, max_grad_norm=0.0)
        Trainer(model, args, random_dataset(), data_collator=collator).train()
        return model, collator.batches

    acc_model, acc_batches = one_step("acc", 2, 4)
    big_model, big_batches = one_step("big", 8, 1)
    counts = [int((b["labels"] != -100).sum()) for b in acc_batches]
    assert len(set(counts)) > 1  # the micro-batches really are uneven
    torch.testing.assert_close(flat_params(acc_model), flat_params(big_model), atol=1e-6, rtol=0)
    # And the logged loss is the token mean of the whole step, not the mean of micro-batch means.
    acc_loss, big_loss = read_records(tmp_path / "acc" / "run")[0]["loss"], read_records(tmp_path / "big" / "run")[0]["loss"]
    assert acc_loss == pytest.approx(big_loss, rel=1e-6)


def _manual_grad_norm(batch) -> float:
    model = tiny_gpt()
    model(**batch).backward()
    return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))


def test_logged_grad_norm_is_before_clipping_and_clipping_bounds_the_update(tmp_path):
    # adam_epsilon = 1 makes AdamW's first update lr * g / (|g| + 1): at most lr * |g| per element,
    # so with clipping the whole update is bounded by lr * max_grad_norm.
    lr, max_norm = 0.1, 0.001
    collator = RecordingCollator()
    model = tiny_gpt()
    before = flat_params(model)
    args = make_args(tmp_path / "clip", max_steps=1, learning_rate=lr, max_grad_norm=max_norm, adam_epsilon=1.0)
    Trainer(model, args, random_dataset(), data_collator=collator).train()
    clipped_update = float((flat_params(model) - before).norm())

    pre_clip = _manual_grad_norm(collator.batches[0])
    logged = read_records(args.output_dir)[0]["grad_norm"]
    assert pre_clip > 100 * max_norm
    assert logged == pytest.approx(pre_clip, rel=1e-5)
    assert 0 < clipped_update <= lr * max_norm * (1 + 1e-5)

    free_model = tiny_gpt()
    free_args = make_args(tmp_path / "free", max_steps=1, learning_rate=lr, max_grad_norm=0.0, adam_epsilon=1.0)
    Trainer(free_model, free_args, random_dataset()).train()
    free_update = float((flat_params(free_model) - before).norm())
    assert read_records(free_args.output_dir)[0]["grad_norm"] == pytest.approx(pre_clip, rel=1e-5)
    assert free_update > 20 * clipped_update


def test_weight_decay_skips_one_dimensional_parameters(tmp_path):
    model = tiny_gpt()
    trainer = Trainer(model, make_args(tmp_path, weight_decay=0.1), random_dataset())
    groups = trainer.optimizer.param_groups
    assert len(groups) == 2
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in groups[0]["params"]}
    kept = {names[id(p)] for p in groups[1]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert decayed | kept == set(names.values()) and not decayed & kept
    assert all(dict(model.named_parameters())[n].dim() >= 2 for n in decayed)
    assert all(dict(model.named_parameters())[n].dim() == 1 for n in kept)
    assert "gpt.norm.weight" in kept and "gpt.norm.bias" in kept
    assert any(n.endswith(".bias") and ".attn." in n for n in kept)
    assert "gpt.embeddings.word_embeddings.weight" in decayed
    assert any(n.endswith(".weight") and ".mlp." in n for n in decayed)


def test_fresh_run_into_a_used_output_dir_never_mixes_two_runs(tmp_path):
    Trainer(tiny_gpt(), make_args(tmp_path, max_steps=6), random_dataset()).train()  # leaves checkpoint 6
    second = make_args(tmp_path, max_steps=3)  # the same output_dir, resume_from_checkpoint=None
    try:
        Trainer(tiny_gpt(), second, random_dataset()).train()
    except ValueError as err:  # refusing is fine, if it says how to continue or where else to go
        assert "resume_from_checkpoint" in str(err)
        assert [r["step"] for r in read_records(second.output_dir)] == list(range(1, 7))
        return
    steps = [r["step"] for r in read_records(second.output_dir)]
    assert steps == [1, 2, 3], f"metrics.jsonl mixes two runs: {steps}"
    # ... and "auto" must not resume the second run from the first run's step-6 checkpoint.
    assert resolve_resume(second.output_dir, "auto").name == "checkpoint-00000003"


# -- recompute ----------------------------------------------------------------------------------
X = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(1))


def _loss_and_grads(model, mode, seed=5):
    apply_recompute(model, mode)
    model.train()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss = model(input_ids=X, labels=X)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_matches_plain_loss_and_gradients(mode, dropout):
    model = tiny_gpt(dropout=dropout, attention_dropout=dropout)
    ref_loss, ref_grads = _loss_and_grads(model, "none")
    loss, grads = _loss_and_grads(model, mode)
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=0)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=0, msg=name)
    if dropout:  # dropout really is on: another seed gives another loss
        other, _ = _loss_and_grads(model, mode, seed=6)
        assert abs(float(other - loss)) > 1e-4


class CheckpointSpy:
    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, fn, *args, **kwargs):
        self.calls.append(kwargs)
        return self.real(fn, *args, **kwargs)


def test_apply_recompute_counts_switches_and_restores(monkeypatch):
    spy = CheckpointSpy(recompute_module.checkpoint)
    monkeypatch.setattr(recompute_module, "checkpoint", spy)
    model = tiny_gpt()
    keys = list(model.state_dict())
    model.train()

    assert apply_recompute(model, "full") == 2
    assert apply_recompute(model, "full") == 2  # idempotent: not wrapped twice
    model(input_ids=X, labels=X).backward()
    assert len(spy.calls) == 2 and all("context_fn" not in c and c["use_reentrant"] is False for c in spy.calls)
    assert list(model.state_dict()) == keys

    spy.calls.clear()
    assert apply_recompute(model, "selective") == 2
    model(input_ids=X, labels=X).backward()
    assert len(spy.calls) == 2 and all("context_fn" in c for c in spy.calls)

    spy.calls.clear()
    assert apply_recompute(model, "none") == 0
    assert all("forward" not in block.__dict__ for block in model.gpt.layers)
    model(input_ids=X, labels=X).backward()
    assert spy.calls == []
    assert list(model.state_dict()) == keys

    with pytest.raises(ValueError, match="'none', 'full' or 'selective'"):
        apply_recompute(model, "everything")


def test_recompute_runs_the_plain_forward_without_grad(monkeypatch):
    spy = CheckpointSpy(recompute_module.checkpoint)
    monkeypatch.setattr(recompute_module, "checkpoint", spy)
    plain = tiny_gpt()
    wrapped = tiny_gpt()
    apply_recompute(wrapped, "full")
    with torch.no_grad():
        expected = plain(input_ids=X)
        got = wrapped(input_ids=X)
    assert spy.calls == []
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_recompute_on_a_plain_module_list():
    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(3))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x.square().mean()

    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    model = Stack()
    model(x).backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    assert apply_recompute(model, "full") == 3
    model(x).backward()
    for grad, ref in zip((p.grad for p in model.parameters()), expected, strict=True):
        torch.testing.assert_close(grad, ref, atol=1e-7, rtol=0)


def test_deepcopy_of_a_recomputed_model_runs_its_own_weights():
    plain = tiny_gpt()
    wrapped = tiny_gpt()
    apply_recompute(wrapped, "full")
    plain_copy, wrapped_copy = copy.deepcopy(plain), copy.deepcopy(wrapped)
    with torch.no_grad():
        for a, b in zip(plain_copy.parameters(), wrapped_copy.parameters(), strict=True):
            a.add_(0.5)
            b.add_(0.5)
    plain_copy.train()
    wrapped_copy.train()
    expected = plain_copy(input_ids=X, labels=X)
    got = wrapped_copy(input_ids=X, labels=X)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def _activation_bytes(mode: str) -> int:
    """Bytes still held after the forward pass (what backward will need), from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    model = tiny_gpt()
    apply_recompute(model, mode)
    model.train()
    x = torch.randint(0, VOCAB, (8, SEQ), generator=torch.Generator().manual_seed(1))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = model(input_ids=x, labels=x)
    held = sum(event.self_cpu_memory_usage for event in prof.events())
    loss.backward()
    return held


def test_full_recompute_holds_less_activation_memory():
    none, full, selective = (_activation_bytes(mode) for mode in ("none", "full", "selective"))
    assert none > 0
    assert full < 0.5 * none
    assert full < selective < none


# -- AMP ----------------------------------------------------------------------------------------
def test_bf16_trains_with_finite_loss(tmp_path, monkeypatch):
    # The real emulation check times bf16 GEMMs (slow on an AVX2 CPU): give it the rates.
    monkeypatch.setattr("sampan.amp._CPU_GEMM_RATES", (2e11, 1e11))
    fp32_args = make_args(tmp_path / "fp32", max_steps=3, per_device_train_batch_size=2, learning_rate=1e-2)
    Trainer(tiny_gpt(), fp32_args, random_dataset()).train()
    args = make_args(tmp_path / "bf16", max_steps=3, per_device_train_batch_size=2, learning_rate=1e-2, amp="bf16")
    model = tiny_gpt()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fast bf16: no slowness warning
        state = Trainer(model, args, random_dataset()).train()
    assert state.global_step == 3 and state.skipped_steps == 0
    losses = [r["loss"] for r in read_records(args.output_dir)]
    reference = [r["loss"] for r in read_records(fp32_args.output_dir)]
    assert all(math.isfinite(x) for x in losses)
    assert losses != reference  # autocast really ran the matmuls in bf16 ...
    assert losses == pytest.approx(reference, abs=0.05)  # ... and they agree to bf16 precision
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    assert "loss_scale" not in read_records(args.output_dir)[0]


def test_bf16_on_a_cpu_without_fast_bf16_warns(tmp_path, monkeypatch):
    monkeypatch.setattr("sampan.amp._CPU_GEMM_RATES", (1e9, 6e10))
    args = make_args(tmp_path, max_steps=1, per_device_train_batch_size=2, amp="bf16")
    with pytest.warns(UserWarning, match="amp='bf16' on a CPU without fast bf16 matmuls"):
        Trainer(tiny_gpt(), args, random_dataset()).train()


class InfGradAt:
    """A gradient hook making one parameter's gradient inf on the n-th backward pass."""

    def __init__(self, param: torch.Tensor, at_call: int):
        self.calls, self.at_call = 0, at_call
        param.register_hook(self)

    def __call__(self, grad):
        self.calls += 1
        return torch.full_like(grad, math.inf) if self.calls == self.at_call else grad


def test_fp16_overflow_skips_the_step_and_halves_the_scale(tmp_path):
    model = tiny_gpt()
    InfGradAt(model.gpt.norm.weight, at_call=3)
    args = make_args(tmp_path, max_steps=5, per_device_train_batch_size=2, learning_rate=1e-2, amp="fp16")
    trainer, snaps = snapshot_trainer(model, args, random_dataset())
    state = trainer.train()

    assert state.global_step == 5 and state.skipped_steps == 1
    assert torch.equal(snaps.params[3], snaps.params[2])  # the overflowing step changed nothing
    for step in (1, 2, 4, 5):
        assert not torch.equal(snaps.params[step], snaps.params[step - 1])
    records = read_records(args.output_dir)
    assert [r["loss_scale"] for r in records] == [65536.0, 65536.0, 32768.0, 32768.0, 32768.0]
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 1, 1]
    assert not math.isfinite(records[2]["grad_norm"])
    assert all(math.isfinite(r["loss"]) for r in records)  # the loss itself was fine
    # The schedule did not advance on the skipped step (and the optimizer took 4 steps).
    assert [snaps.sched_epoch[s] for s in range(6)] == [0, 1, 2, 2, 3, 4]
    # Each record logs the rate its step used: the step after the skipped one reuses that rate.
    assert records[3]["lr"] == records[2]["lr"] < records[1]["lr"]
    assert records[4]["lr"] < records[3]["lr"]
    adam_steps = {float(s["step"]) for s in trainer.optimizer.torch_optimizer.state.values()}
    assert adam_steps == {4.0}


def test_fp16_without_overflow_keeps_the_scale(tmp_path):
    args = make_args(tmp_path, max_steps=3, per_device_train_batch_size=2, learning_rate=1e-2, amp="fp16")
    state = Trainer(tiny_gpt(), args, random_dataset()).train()
    records = read_records(args.output_dir)
    assert state.skipped_steps == 0
    assert [r["loss_scale"] for r in records] == [65536.0] * 3
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records)


def test_auto_cast_and_grad_scaler():
    with auto_cast(enable=False):
        assert not torch.is_autocast_enabled("cpu")
    with auto_cast(dtype="bfloat16"):
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        auto_cast(dtype="float32")
    scaler = GradScaler("cpu", init_loss_scaling=1024.0)
    assert scaler.is_enabled() and scaler.get_scale() == 1024.0
    assert not GradScaler("cpu", enable=False).is_enabled()


# -- the non-finite loss guard ------------------------------------------------------------------
class NanLossAt(nn.Module):
    """Wraps a model; the loss is nan on the listed forward calls (1-based)."""

    def __init__(self, inner: nn.Module, bad_calls):
        super().__init__()
        self.inner, self.bad_calls, self.calls = inner, set(bad_calls), 0

    def forward(self, **batch):
        self.calls += 1
        loss = self.inner(**batch)
        return loss * math.nan if self.calls in self.bad_calls else loss


def test_nonfinite_loss_step_is_skipped(tmp_path):
    model = NanLossAt(tiny_gpt(), bad_calls={3})
    args = make_args(tmp_path, max_steps=5, learning_rate=1e-2)
    trainer, snaps = snapshot_trainer(model, args, random_dataset())
    state = trainer.train()
    assert state.global_step == 5
    assert state.skipped_steps == 1 and state.consecutive_nonfinite == 0
    assert torch.equal(snaps.params[3], snaps.params[2])
    assert not torch.equal(snaps.params[4], snaps.params[3])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert [snaps.sched_epoch[s] for s in range(6)] == [0, 1, 2, 2, 3, 4]
    records = read_records(args.output_dir)
    assert math.isnan(records[2]["loss"]) and records[2]["grad_norm"] is None
    assert [r["skipped_steps"] for r in records] == [0, 0, 1, 1, 1]
    assert all(math.isfinite(r["loss"]) for i, r in enumerate(records) if i != 2)


def test_nonfinite_loss_keeps_happening_raises(tmp_path):
    model = NanLossAt(tiny_gpt(), bad_calls=range(2, 100))
    args = make_args(tmp_path, max_steps=10, max_nonfinite_steps=3)
    trainer, snaps = snapshot_trainer(model, args, random_dataset())
    with pytest.raises(FloatingPointError, match=r"non-finite for 3 steps in a row \(last at step 4\)") as err:
        trainer.train()
    assert "learning_rate" in str(err.value)  # says what to do
    assert trainer.state.skipped_steps == 3
    assert torch.equal(snaps.params[3], snaps.params[1])
    assert torch.equal(flat_params(model), snaps.params[1])


# -- monitoring, evaluation, checkpoints --------------------------------------------------------
def _accuracy(prediction: EvalPrediction) -> dict[str, float]:
    predicted = prediction.predictions[:, :-1].argmax(-1)
    return {"accuracy": float((predicted == prediction.label_ids[:, 1:]).float().mean()),
            "count": float(prediction.label_ids.shape[0])}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    """One 5-step run with everything on: eval every 2 steps, TensorBoard, MFU, rotation."""
    out = tmp_path_factory.mktemp("full") / "run"
    model = tiny_gpt()
    args = make_args(out.parent, output_dir=str(out), max_steps=5, eval_steps=2, save_steps=2, save_total_limit=2,
                     tensorboard=True, peak_flops=1e9, per_device_eval_batch_size=4)
    eval_set = random_dataset(12 * SEQ, seed=1)
    trainer = Trainer(model, args, random_dataset(), eval_dataset=eval_set, compute_metrics=_accuracy)
    state = trainer.train()
    return {"out": out, "trainer": trainer, "state": state, "model": model}


def test_metrics_jsonl_has_the_monitoring_fields(full_run):
    records = read_records(full_run["out"])
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    for r in records:
        for key in ("step", "loss", "lr", "grad_norm", "tokens_per_sec", "data_wait_pct", "memory_mb",
                    "step_time_sec", "epoch", "skipped_steps", "eta_sec", "mfu"):
            assert key in r, key
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0 and r["tokens_per_sec"] > 0
        assert 0.0 <= r["data_wait_pct"] <= 100.0
        assert r["memory_mb"] > 10
        assert r["max_steps"] == 5
    assert records[-1]["eta_sec"] == 0.0
    assert full_run["state"].tokens_seen == 5 * 4 * SEQ


def test_mfu_is_model_flops_over_peak(full_run):
    flops_per_token = full_run["model"].config.flops_per_token(SEQ)
    for r in read_records(full_run["out"]):
        assert r["mfu"] == pytest.approx(flops_per_token * r["tokens_per_sec"] / 1e9, rel=1e-9)


def test_no_mfu_when_peak_flops_is_zero(tmp_path):
    args = make_args(tmp_path, max_steps=1, peak_flops=0)
    Trainer(tiny_gpt(), args, random_dataset()).train()
    assert "mfu" not in read_records(args.output_dir)[0]


def test_logged_loss_averages_the_logging_window(tmp_path):
    every = make_args(tmp_path / "every", max_steps=4, logging_steps=1)
    Trainer(tiny_gpt(), every, random_dataset()).train()
    threes = make_args(tmp_path / "threes", max_steps=4, logging_steps=3)
    Trainer(tiny_gpt(), threes, random_dataset()).train()
    each = {r["step"]: r["loss"] for r in read_records(every.output_dir)}
    windows = {r["step"]: r["loss"] for r in read_records(threes.output_dir)}
    assert list(windows) == [3, 4]  # every 3 steps, and the last one
    assert windows[3] == pytest.approx((each[1] + each[2] + each[3]) / 3, rel=1e-6)
    assert windows[4] == pytest.approx(each[4], rel=1e-6)


def test_eval_records_and_compute_metrics_in_the_run(full_run):
    evals = read_records(full_run["out"], "eval")
    assert [r["step"] for r in evals] == [2, 4, 5]
    for r in evals:
        assert math.isfinite(r["eval_loss"])
        assert 0.0 <= r["eval_accuracy"] <= 1.0
        assert r["eval_count"] == 12.0


def test_tensorboard_events_hold_the_train_loss(full_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb_dir = full_run["out"] / "tensorboard"
    assert list(tb_dir.glob("events.out.tfevents.*"))
    accumulator = EventAccumulator(str(tb_dir))
    accumulator.Reload()
    scalars = accumulator.Tags()["scalars"]
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/mfu", "eval/eval_loss", "eval/eval_accuracy"):
        assert tag in scalars, tag
    logged = {r["step"]: r["loss"] for r in read_records(full_run["out"])}
    events = {e.step: e.value for e in accumulator.Scalars("train/loss")}
    assert list(events) == [1, 2, 3, 4, 5]
    for step, value in events.items():
        assert value == pytest.approx(logged[step], rel=1e-6)


def test_checkpoint_rotation_and_contents(full_run):
    out = full_run["out"]
    kept = sorted(p.name for p in out.glob("checkpoint-*"))
    assert kept == ["checkpoint-00000004", "checkpoint-00000005"]  # 2, 4, 5 saved; limit 2
    final = out / "checkpoint-00000005"
    for name in ("manifest.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"):
        assert (final / name).is_file(), name
    parts = load_checkpoint(final)
    for key, value in full_run["model"].state_dict().items():
        assert torch.equal(parts["model"][key], value), key
    assert parts["trainer_state"]["state"]["global_step"] == 5
    assert parts["trainer_state"]["args"]["save_total_limit"] == 2


def _eval_trainer(tmp_path, eval_windows: int, batch: int):
    model = tiny_gpt()
    eval_set = random_dataset(eval_windows * SEQ, seed=3)
    assert len(eval_set) == eval_windows
    args = make_args(tmp_path, per_device_eval_batch_size=batch)
    trainer = Trainer(model, args, random_dataset(), eval_dataset=eval_set, compute_metrics=_accuracy)
    return trainer, model, eval_set


def _per_sample_losses(model, eval_set) -> list[float]:
    model.eval()
    with torch.no_grad():
        return [float(model(input_ids=s["input_ids"][None], labels=s["labels"][None])) for s in eval_set]


def test_evaluate_loss_is_the_mean_model_loss(tmp_path):
    trainer, model, eval_set = _eval_trainer(tmp_path, eval_windows=12, batch=4)
    model.train()
    metrics = trainer.evaluate()
    assert model.training  # evaluate() restores the mode
    assert metrics["step"] == 0
    assert metrics["eval_loss"] == pytest.approx(np.mean(_per_sample_losses(model, eval_set)), rel=1e-5)

    samples = collate_dicts([eval_set[i] for i in range(len(eval_set))])
    with torch.no_grad():
        logits = model(input_ids=samples["input_ids"])
    accuracy = float((logits[:, :-1].argmax(-1) == samples["labels"][:, 1:]).float().mean())
    assert metrics["eval_accuracy"] == pytest.approx(accuracy)
    assert metrics["eval_count"] == 12.0
    assert read_records(trainer.args.output_dir, "eval")[-1]["eval_loss"] == metrics["eval_loss"]


def test_evaluate_weights_a_short_last_batch_by_its_size(tmp_path):
    # 11 windows in batches of 4: 4 + 4 + 3. Every window has the same token count, so the eval
    # loss over the set is the plain mean of the 11 per-window losses.
    trainer, model, eval_set = _eval_trainer(tmp_path, eval_windows=11, batch=4)
    metrics = trainer.evaluate()
    assert metrics["eval_loss"] == pytest.approx(np.mean(_per_sample_losses(model, eval_set)), rel=1e-6)


def test_compute_metrics_receives_predictions_and_labels(tmp_path):
    seen = []

    def metrics_fn(prediction: EvalPrediction):
        seen.append(prediction)
        return {"answer": 42.0, "eval_already_prefixed": 1.0}

    model = tiny_gpt()
    eval_set = random_dataset(6 * SEQ, seed=4)
    trainer = Trainer(model, make_args(tmp_path, per_device_eval_batch_size=4), random_dataset(),
                      eval_dataset=eval_set, compute_metrics=metrics_fn)
    metrics = trainer.evaluate()
    assert len(seen) == 1
    assert seen[0].predictions.shape == (6, SEQ, VOCAB) and seen[0].predictions.dtype == torch.float32
    assert torch.equal(seen[0].label_ids, torch.stack([eval_set[i]["labels"] for i in range(6)]))
    assert metrics["eval_answer"] == 42.0 and metrics["eval_already_prefixed"] == 1.0
    assert "answer" not in metrics


def test_evaluate_without_a_dataset_is_a_clear_error(tmp_path):
    trainer = Trainer(tiny_gpt(), make_args(tmp_path), random_dataset())
    with pytest.raises(ValueError, match="needs an eval_dataset"):
        trainer.evaluate()


# -- reports and hardware -----------------------------------------------------------------------
def test_plot_curves_writes_a_png(full_run, tmp_path):
    png = plot_curves(full_run["out"], tmp_path / "curves.png")
    data = png.read_bytes()
    assert png == tmp_path / "curves.png"
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
    assert not list(tmp_path.glob("*.tmp.png"))


def test_summarize_matches_metrics_jsonl(full_run):
    train, evals = read_metrics(full_run["out"])
    losses = [r["loss"] for r in train]
    summary = summarize(full_run["out"])
    assert summary["steps"] == 5
    assert summary["first_loss"] == losses[0]
    assert summary["last_loss"] == losses[-1]
    assert summary["best_loss"] == min(losses)
    assert summary["last_eval_loss"] == evals[-1]["eval_loss"]
    assert summary["best_eval_loss"] == min(r["eval_loss"] for r in evals)
    assert summary["skipped_steps"] == 0
    assert summary["median_mfu"] == sorted(r["mfu"] for r in train)[2]
    assert summary["median_tokens_per_sec"] == sorted(r["tokens_per_sec"] for r in train)[2]


def test_summarize_ignores_nonfinite_losses_and_torn_lines(tmp_path):
    lines = [{"kind": "train", "step": 1, "loss": 3.0, "lr": 0.1},
             {"kind": "train", "step": 2, "loss": float("nan"), "lr": 0.1, "skipped_steps": 1},
             {"kind": "train", "step": 3, "loss": 2.0, "lr": 0.1, "skipped_steps": 1}]
    text = "".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "train", "st'
    (tmp_path / "metrics.jsonl").write_text(text)
    summary = summarize(tmp_path)
    assert summary == {"steps": 3, "first_loss": 3.0, "last_loss": 2.0, "best_loss": 2.0, "skipped_steps": 1}


def test_read_metrics_errors(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        read_metrics(tmp_path)
    assert "metrics.jsonl not found" in str(err.value) and "not a Trainer output directory" in str(err.value)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="holds no metrics yet"):
        read_metrics(tmp_path)


def test_hardware_probes():
    state = torch.get_rng_state()
    flops = measure_gemm_flops(torch.float32, size=64, seconds=0.01)
    assert flops > 1e6
    assert torch.equal(torch.get_rng_state(), state)  # measuring never shifts the global RNG
    assert process_memory_mb() > 10

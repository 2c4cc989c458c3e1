"""One training loop: the Trainer never asks which backend it runs on.

Where a run happens (one process or one fleet rank) is a ``TrainingBackend``'s business
(``sampan/trainer/backend.py``); ``make_backend(args)`` picks it once. These tests pin that the
Trainer's source holds no fleet branch, that ``LocalBackend`` and ``FleetBackend`` offer the same
interface, and that the loop drives a step only through that interface.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch

import sampan.trainer.trainer as trainer_module
from sampan.io import TokenWindowDataset
from sampan.models import create
from sampan.trainer import Trainer, TrainingArguments
from sampan.trainer.backend import LocalBackend, TrainingBackend, make_backend

TRAINER_SOURCE = Path(trainer_module.__file__)
# The one member allowed to look at the strategy: the ``Trainer.fleet`` compatibility property
# (scripts ask it whether to shut the process group down), which the Trainer itself never reads.
COMPAT = {"fleet"}


def _fleet_backend_class():
    from sampan.trainer.fleet_backend import FleetBackend  # torch.distributed: seconds to import

    return FleetBackend


def _names(node: ast.AST) -> set[str]:
    """Every attribute and variable name read anywhere under ``node``."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Name):
            found.add(sub.id)
    return found


def _trainer_tree() -> ast.Module:
    return ast.parse(TRAINER_SOURCE.read_text(encoding="utf-8"), filename=str(TRAINER_SOURCE))


def _outside_compat(tree: ast.Module):
    """Every node of trainer.py except those inside the compatibility members."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in COMPAT:
            skipped.update(id(sub) for sub in ast.walk(node))
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def test_trainer_source_has_no_fleet_branch():
    tree = _trainer_tree()
    problems = []
    for node in _outside_compat(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)):
            hits = _names(node.test) & {"fleet", "strategy", "FleetBackend", "LocalBackend", "is_fleet"}
            if hits:
                problems.append(f"line {line}: a condition on {sorted(hits)}")
        if isinstance(node, ast.BoolOp):
            hits = _names(node) & {"fleet", "is_fleet"}
            if hits:
                problems.append(f"line {line}: a boolean expression on {sorted(hits)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "type"):
            hits = _names(node) & {"FleetBackend", "LocalBackend", "TrainingBackend"}
            if hits:
                problems.append(f"line {line}: {node.func.id}() on {sorted(hits)}")
        if isinstance(node, ast.Attribute) and node.attr == "fleet":
            problems.append(f"line {line}: reads an attribute named fleet")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any("fleet" in m or "distributed" in m for m in modules):
                problems.append(f"line {line}: imports {modules}")
    assert not problems, "Trainer branches on the backend:\n" + "\n".join(problems)


def test_trainer_source_passes_the_issue_grep():
    text = TRAINER_SOURCE.read_text(encoding="utf-8")
    for needle in ("self.fleet", "if fleet", "is_fleet"):
        assert needle not in text, needle


def _public(cls) -> dict[str, object]:
    """Public methods and properties a backend class offers (its own and inherited ones)."""
    return {name: inspect.getattr_static(cls, name) for name in dir(cls)
            if not name.startswith("_") and name not in vars(object)}


def test_local_and_fleet_backends_offer_the_same_interface():
    fleet_cls = _fleet_backend_class()
    assert issubclass(LocalBackend, TrainingBackend) and issubclass(fleet_cls, TrainingBackend)
    local, fleet = _public(LocalBackend), _public(fleet_cls)
    interface = _public(TrainingBackend)
    assert set(local) == set(fleet) == set(interface), (set(local) ^ set(fleet), set(local) ^ set(interface))
    assert not LocalBackend.__abstractmethods__ and not fleet_cls.__abstractmethods__
    for name in TrainingBackend.__abstractmethods__:  # each backend implements each of these itself
        assert name in vars(LocalBackend) and name in vars(fleet_cls), name
    for name, member in interface.items():
        assert type(local[name]) is type(member) is type(fleet[name]), name  # property stays property
        if callable(member):
            want = list(inspect.signature(member).parameters)
            assert list(inspect.signature(local[name]).parameters) == want, name
            assert list(inspect.signature(fleet[name]).parameters) == want, name


# -- the loop through the interface ---------------------------------------------------------------
def _tiny(tmp_path: Path, **overrides):
    torch.manual_seed(0)
    model = create("gpt-tiny", vocab_size=97, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=32)
    dataset = TokenWindowDataset(np.random.default_rng(0).integers(0, 97, 3000), seq_len=32)
    base = dict(output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4, logging_steps=1,
                save_steps=0, tensorboard=False, progress_bar=False, peak_flops=0, seed=0)
    base.update(overrides)
    return model, TrainingArguments(**base), dataset


def test_make_backend_without_a_strategy_is_local(tmp_path):
    _, args, _ = _tiny(tmp_path)
    backend = make_backend(args)
    assert isinstance(backend, LocalBackend)
    assert (backend.rank, backend.world_size, backend.data_rank, backend.data_world_size) == (0, 1, 0, 1)
    assert backend.is_main
    assert backend.job_totals(7, 3.5) == (7, 3.5) and backend.job_peak_flops(2e9) == 2e9


class Recording(LocalBackend):
    """A LocalBackend that records the interface calls the Trainer makes."""

    def __init__(self, args):
        super().__init__(args)
        self.calls: list[str] = []

    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        if not name.startswith("_") and name != "calls" and callable(value) and name in vars(TrainingBackend):
            self.calls.append(name)
        return value


def test_the_loop_runs_every_step_through_the_backend(tmp_path, monkeypatch):
    model, args, dataset = _tiny(tmp_path, gradient_accumulation_steps=2, max_grad_norm=0.5)
    made: list[Recording] = []
    monkeypatch.setattr(trainer_module, "make_backend", lambda a: made.append(Recording(a)) or made[-1])
    trainer = Trainer(model, args, dataset, eval_dataset=dataset)
    backend = made[0]
    assert trainer.backend is backend and trainer.fleet is None
    assert trainer.model is backend.model is model
    assert (trainer.optimizer, trainer.scaler, trainer.device) == (backend.optimizer, backend.scaler, backend.device)
    assert backend.calls == ["check_compute_metrics", "setup"]
    backend.calls.clear()
    trainer.train()
    step = ["forward_backward", "job_totals", "clip_gradients", "optimizer_step", "zero_grad"]
    # barrier after the fresh-output-dir check; three steps; the end-of-run eval and checkpoint.
    assert backend.calls == ["barrier", *step * 3, "eval_loss", "save"]
    path = tmp_path / "run" / "checkpoint-00000003"
    assert path.is_dir()
    backend.calls.clear()
    assert trainer.save_pretrained(tmp_path / "model") is not None
    assert backend.calls == ["save_pretrained"]


def test_local_backend_save_load_round_trip_restores_rng(tmp_path):
    model, args, _ = _tiny(tmp_path)
    backend = LocalBackend(args)
    from sampan.trainer.schedules import build_schedule

    backend.setup(model, build_schedule(args, 3))
    state = {"state": {"global_step": 1}, "data": {}, "scaler": {}, "args": {}}
    path = backend.save(tmp_path / "out", 1, state)
    expected = torch.rand(3)  # the draw right after the save
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    torch.rand(5)
    saved = backend.load(path)
    assert list(saved) == ["state", "rng", "data", "scaler", "args"]  # the order checkpoints always had
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(0)
    fresh = create("gpt-tiny", vocab_size=97, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=32)
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)


def test_fleet_backend_turns_compute_metrics_down_without_a_process_group():
    fleet_cls = _fleet_backend_class()
    backend = fleet_cls.__new__(fleet_cls)  # no process group needed for this check
    backend.check_compute_metrics(None)
    with pytest.raises(ValueError, match="compute_metrics is not supported with a strategy"):
        backend.check_compute_metrics(lambda p: {})

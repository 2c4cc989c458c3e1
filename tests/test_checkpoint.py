"""sampan.checkpoint: exact state round trips, atomic saves, verification, rotation, resume."""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import math
import pickle
import random
import struct
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

import sampan.checkpoint.store as store
from sampan.checkpoint import (
    CheckpointError,
    capture_rng_state,
    flatten_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    resolve_resume,
    restore_rng_state,
    save_checkpoint,
    unflatten_state,
    verify_checkpoint,
)
from sampan.optimizer import AdamW, lr

# --- helpers ---------------------------------------------------------------------------------------


def assert_identical(a: Any, b: Any, where: str = "<root>") -> None:
    """Same types all the way down (tuple vs list, int vs str keys, np.float32 vs float), same
    dtypes and shapes, and the same bits (so NaN == NaN and -0.0 != 0.0)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, dict):
        assert [(type(k), k) for k in a] == [(type(k), k) for k in b], f"{where}: keys differ"
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
        if isinstance(a, OrderedDict):
            assert_identical(
                getattr(a, "_metadata", None), getattr(b, "_metadata", None), f"{where}._metadata"
            )
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{where}: lengths differ"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}.{i}")
    elif isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.requires_grad) == (b.dtype, b.shape, b.requires_grad), where
        assert bits(a) == bits(b), f"{where}: values differ"
    elif isinstance(a, (np.ndarray, np.generic)):
        assert (a.dtype.str, a.shape) == (b.dtype.str, b.shape), where
        assert a.tobytes() == b.tobytes(), f"{where}: values differ"
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b)), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def through_files(obj: Any) -> Any:
    """flatten -> safetensors bytes + JSON text -> unflatten: what a checkpoint does, in memory."""
    tensors, skeleton = flatten_state(obj)
    text = json.dumps(skeleton, allow_nan=False)  # strict JSON: no NaN/Infinity literals
    return unflatten_state(st_load(st_save(tensors)), json.loads(text))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.tanh(self.fc1(x))))


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def adamw_step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 2, generator=gen)
    torch.manual_seed(seed)  # dropout mask
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def small_checkpoint(out: Path, step: int, **kwargs: Any) -> Path:
    components = {
        "model": make_net(step).state_dict(),
        "trainer_state": {"step": step, "rng": capture_rng_state()},
    }
    return save_checkpoint(out, step, components, **kwargs)


def hidden_entries(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("."))


# --- the codec ---------------------------------------------------------------------------------------


def test_adamw_state_round_trip_continues_bit_identically() -> None:
    model = make_net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, amsgrad=True)
    for seed in range(3):
        adamw_step(model, opt, seed)
    state = opt.state_dict()
    assert all(type(k) is int for k in state["state"])  # what JSON alone would turn into "0", "1", ...

    restored = through_files(state)
    assert_identical(state, restored)

    twin = make_net(seed=99)
    twin.load_state_dict(model.state_dict())
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1, amsgrad=True)
    twin_opt.load_state_dict(restored)
    for seed in (3, 4):
        adamw_step(model, opt, seed)
        adamw_step(twin, twin_opt, seed)
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert bits(p) == bits(q), name
    assert_identical(opt.state_dict(), twin_opt.state_dict())


def test_nested_mixed_structure_round_trips_exactly() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    linear_state = nn.Linear(2, 3).state_dict()  # an OrderedDict carrying _metadata (module versions)
    state = {
        "ints": {0: "zero", 3: (1, 2.5, [None, True, False]), "3": "the string three", -7: []},
        "floats": [math.inf, -math.inf, math.nan, -0.0, 5e-324, 1.7976931348623157e308, 0.1],
        "big": 2**80,
        "text": "混合精度 ✓",
        "bf16": torch.randn(5, 3).to(torch.bfloat16),
        "scalar": torch.tensor(7, dtype=torch.int64),
        "f16_scalar": torch.tensor(-0.0, dtype=torch.float16),
        "bool": torch.tensor([True, False]),
        "empty": torch.zeros(0, 4),
        "rare": [torch.randn(3, dtype=torch.complex128), torch.randn(4).to(torch.float8_e4m3fn)],
        "view_and_base": (base, base[1:, ::2], base.t()),  # share storage: stored as copies
        "param": nn.Parameter(torch.ones(2)),
        "np": {
            "f64": np.linspace(0, 1, 5),
            "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
            "zero_d": np.array(3.5, dtype=np.float32),
            "u32": np.arange(4, dtype=np.uint32),
            "strided": np.arange(10.0)[::3],
            "scalar": np.float32(2.5),
            "bool_scalar": np.bool_(True),
        },
        "bytes": b"\x00\xff data",
        "linear": linear_state,
    }
    restored = through_files(state)
    assert_identical(state, restored)
    assert restored["linear"]._metadata == linear_state._metadata
    assert isinstance(restored["param"], nn.Parameter) and restored["param"].requires_grad


def test_tensor_keys_are_readable_paths_and_never_collide() -> None:
    state = {"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}, 3: torch.ones(2), "3": torch.zeros(2)}
    tensors, _ = flatten_state(state)
    assert sorted(tensors) == ["3", "3~1", "a.b", "a.b~1"]
    assert_identical(state, through_files(state))


@dataclass
class Args:
    lr: float = 0.1


@pytest.mark.parametrize(
    ("state", "path", "hint"),
    [
        ({"state": {3: {"step": object()}}}, "optimizer.state.3.step", "supported are"),
        ({"args": Args()}, "optimizer.args", "dataclasses.asdict"),
        (
            {
                "sched": torch.optim.lr_scheduler.LambdaLR(
                    torch.optim.SGD([torch.zeros(1)], lr=1.0), lambda e: 1.0
                )
            },
            "optimizer.sched",
            "state_dict",
        ),
        ({"groups": [{("a", 1): 2}]}, "optimizer.groups.0.('a', 1)", "keys must be str or int"),
        ({"f": [np.float64(1.0), np.array(["text"])]}, "optimizer.f.1", "numeric"),
    ],
)
def test_unknown_type_error_names_its_path(state: dict[str, Any], path: str, hint: str) -> None:
    with pytest.raises(TypeError) as caught:
        flatten_state(state, root="optimizer")
    assert repr(path) in str(caught.value) and hint in str(caught.value)


def test_unflatten_rejects_files_that_do_not_belong_together() -> None:
    tensors, skeleton = flatten_state({"w": torch.ones(2)})
    with pytest.raises(ValueError, match="'w'.*missing"):
        unflatten_state({}, skeleton)
    with pytest.raises(ValueError, match="not named by the skeleton"):
        unflatten_state({**tensors, "stray": torch.ones(1)}, skeleton)
    with pytest.raises(ValueError, match="version 2"):
        unflatten_state(tensors, {**skeleton, "version": 2})


# --- RNG ---------------------------------------------------------------------------------------------


def draw() -> tuple[Any, ...]:
    return (
        random.random(),
        random.gauss(0, 1),
        np.random.rand(3).tolist(),
        np.random.randn(),
        torch.rand(4).tolist(),
    )


def test_rng_round_trip_through_checkpoint_files() -> None:
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    draw()
    state = through_files(capture_rng_state())
    expected = [draw() for _ in range(3)]
    draw()  # move every generator on, then put them back
    restore_rng_state(state)
    assert [draw() for _ in range(3)] == expected


def test_restore_rng_rejects_incomplete_state() -> None:
    with pytest.raises(ValueError, match="missing"):
        restore_rng_state({"python": random.getstate()})


# --- save / load ------------------------------------------------------------------------------------


def test_save_load_round_trip_bit_for_bit(tmp_path: Path) -> None:
    model = make_net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for seed in range(2):
        adamw_step(model, opt, seed)
    trainer_state = {"step": 2, "epoch": 0, "batch_in_epoch": 2, "rng": capture_rng_state(), "loss": math.nan}
    components = {"model": model.state_dict(), "optimizer": opt.state_dict(), "trainer_state": trainer_state}

    path = save_checkpoint(tmp_path / "run", 2, components, extra_files={"config.json": b'{"hidden": 8}'})

    assert path == tmp_path / "run" / "checkpoint-00000002"
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json", "manifest.json", "model.json", "model.safetensors", "optimizer.json",
        "optimizer.safetensors", "trainer_state.json", "trainer_state.safetensors",
    ]  # fmt: skip
    assert verify_checkpoint(path) == []
    loaded = load_checkpoint(path)
    assert list(loaded) == ["model", "optimizer", "trainer_state"]
    for name, state in components.items():
        assert_identical(state, loaded[name], name)
    assert_identical({"model": components["model"]}, load_checkpoint(path, components=["model"]))
    with pytest.raises(CheckpointError, match="no component 'scheduler'"):
        load_checkpoint(path, components=["scheduler"])


def test_manifest_records_sha256_and_size_of_every_file(tmp_path: Path) -> None:
    path = small_checkpoint(tmp_path, 7, extra_files={"notes.txt": "中文".encode()})
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    assert (manifest["format"], manifest["version"], manifest["step"]) == ("sampan-checkpoint", 1, 7)
    assert manifest["components"] == ["model", "trainer_state"]
    assert datetime.datetime.fromisoformat(manifest["created"]).tzinfo is not None
    on_disk = sorted(p.name for p in path.iterdir() if p.name != "manifest.json")
    assert sorted(manifest["files"]) == on_disk
    for name, record in manifest["files"].items():
        data = (path / name).read_bytes()
        assert record == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_files_hold_no_pickle_and_loading_never_unpickles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = make_net()
    opt = torch.optim.AdamW(model.parameters())
    adamw_step(model, opt, 0)
    path = save_checkpoint(tmp_path, 1, {"model": model.state_dict(), "optimizer": opt.state_dict()})
    for file in path.iterdir():
        data = file.read_bytes()
        assert not data.startswith(b"\x80"), f"{file.name} looks like a pickle"
        if file.suffix == ".json":
            json.loads(data)
        else:  # safetensors: an 8-byte little-endian header length, then a JSON header
            (length,) = struct.unpack("<Q", data[:8])
            json.loads(data[8 : 8 + length])

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("checkpoint loading must not unpickle")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    loaded = load_checkpoint(path)
    assert_identical(opt.state_dict(), loaded["optimizer"])


def corrupt_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    data[-1] ^= 0x01  # the last byte of the last tensor's data
    file.write_bytes(bytes(data))


def test_corrupt_byte_is_reported_and_latest_skips_to_previous_good(tmp_path: Path) -> None:
    good = small_checkpoint(tmp_path, 10)
    bad = small_checkpoint(tmp_path, 20)
    corrupt_byte(bad / "model.safetensors")

    problems = verify_checkpoint(bad)
    assert len(problems) == 1 and "model.safetensors is corrupt: sha256" in problems[0]
    with pytest.warns(UserWarning, match=r"checkpoint-00000020.*model\.safetensors is corrupt"):
        assert latest_checkpoint(tmp_path) == good
    messages: list[str] = []
    assert latest_checkpoint(tmp_path, log=messages.append) == good
    assert len(messages) == 1 and str(bad) in messages[0]
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        load_checkpoint(bad)
    # A subset load checks only the files it reads.
    assert load_checkpoint(bad, components=["trainer_state"])["trainer_state"]["step"] == 20


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda p: (p / "manifest.json").unlink(), "manifest.json is missing"),
        (lambda p: (p / "manifest.json").write_text("{not json"), "manifest.json is not valid JSON"),
        (lambda p: (p / "trainer_state.json").unlink(), "trainer_state.json is missing"),
        (
            lambda p: (p / "model.safetensors").write_bytes((p / "model.safetensors").read_bytes()[:-4]),
            "model.safetensors has",
        ),
        (
            lambda p: (p / "model.json").write_text("{}" + " " * ((p / "model.json").stat().st_size - 2)),
            "model.json is corrupt",
        ),
    ],
)
def test_damage_is_reported(tmp_path: Path, damage: Any, problem: str) -> None:
    path = small_checkpoint(tmp_path, 3)
    damage(path)
    problems = verify_checkpoint(path)
    assert len(problems) == 1 and problems[0].startswith(problem), problems
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert (
        isinstance(caught.value, ValueError)
        and problem in str(caught.value)
        and str(path) in str(caught.value)
    )


def test_load_without_manifest_when_told_not_to_verify(tmp_path: Path) -> None:
    path = small_checkpoint(tmp_path, 3)
    (path / "manifest.json").unlink()
    assert load_checkpoint(path, verify=False)["trainer_state"]["step"] == 3


def test_manifest_cannot_point_outside_the_checkpoint(tmp_path: Path) -> None:
    path = small_checkpoint(tmp_path, 3)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"]["../../etc/passwd"] = {"sha256": "0" * 64, "bytes": 1}
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert verify_checkpoint(path) == ["manifest.json lists an unsafe file name '../../etc/passwd'"]


# --- atomicity, rotation, stale temp dirs --------------------------------------------------------


def test_rotation_keeps_the_newest_n(tmp_path: Path) -> None:
    (tmp_path / "checkpoint-best").mkdir()  # not a step: never rotated
    for step in range(1, 6):
        small_checkpoint(tmp_path, step, save_total_limit=3)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4, 5]
    # An older step (a resumed run re-saving) is never the one deleted: the oldest others go.
    small_checkpoint(tmp_path, 2, save_total_limit=3)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 4, 5]
    assert (tmp_path / "checkpoint-best").is_dir() and hidden_entries(tmp_path) == []
    assert all(verify_checkpoint(p) == [] for _, p in list_checkpoints(tmp_path))


def test_crash_mid_save_leaves_no_partial_or_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[Path] = []
    real_save_file = store.save_file

    def recording_save_file(tensors: dict[str, torch.Tensor], filename: Path, **kwargs: Any) -> None:
        real_save_file(tensors, filename, **kwargs)
        written.append(Path(filename))

    monkeypatch.setattr(store, "save_file", recording_save_file)
    components = {"model": make_net().state_dict(), "trainer_state": {"step": 5, "sampler": object()}}
    with pytest.raises(TypeError, match="'trainer_state.sampler'"):
        save_checkpoint(tmp_path, 5, components)
    assert written and written[0].name == "model.safetensors"  # the crash came after real writes
    assert not written[0].exists()
    assert list(tmp_path.iterdir()) == []


def test_failed_resave_of_same_step_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = save_checkpoint(tmp_path, 5, {"trainer_state": {"version": "old"}})
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, 5, {"trainer_state": {"version": "new", "bad": {1, 2}}})
    real_rename = store.os.rename

    def failing_rename(src: Any, dst: Any) -> None:
        if Path(src).name.startswith(".tmp-checkpoint-"):
            raise OSError("disk gone")
        real_rename(src, dst)

    monkeypatch.setattr(store.os, "rename", failing_rename)
    with pytest.raises(OSError, match="disk gone"):
        save_checkpoint(tmp_path, 5, {"trainer_state": {"version": "new"}})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == [old.name]
    assert load_checkpoint(old)["trainer_state"] == {"version": "old"}

    save_checkpoint(tmp_path, 5, {"trainer_state": {"version": "new"}})
    assert load_checkpoint(old)["trainer_state"] == {"version": "new"}
    assert [p.name for p in tmp_path.iterdir()] == [old.name]


def test_stale_temp_dirs_are_cleaned_and_a_set_aside_checkpoint_restored(tmp_path: Path) -> None:
    stale = tmp_path / ".tmp-checkpoint-00000007-x1y2"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half a file")
    (tmp_path / ".tmp-checkpoint-deleting-checkpoint-00000001-0badf00d").mkdir()
    # A kill between the two renames of a same-step replace leaves the old checkpoint set aside.
    set_aside = small_checkpoint(tmp_path, 3).rename(tmp_path / ".replaced-checkpoint-00000003-0123abcd")
    assert list_checkpoints(tmp_path) == [] and latest_checkpoint(tmp_path) is None

    small_checkpoint(tmp_path, 8)
    assert hidden_entries(tmp_path) == [] and not set_aside.exists()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 8]
    assert verify_checkpoint(tmp_path / "checkpoint-00000003") == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step": -1}, "step must be"),
        ({"components": {"../model": {}}}, "not a plain file name"),
        ({"components": {"manifest": {}}}, "manifest.json"),
        ({"extra_files": {"model.json": b"{}"}}, "model.json"),
        ({"save_total_limit": 0}, "save_total_limit"),
        ({"components": {}}, "nothing to checkpoint"),
    ],
)
def test_bad_save_arguments_are_rejected(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"step": 1, "components": {"model": {"w": torch.ones(1)}}, **kwargs}
    with pytest.raises(ValueError, match=message):
        save_checkpoint(tmp_path, **args)
    assert list(tmp_path.iterdir()) == []


# --- resume -------------------------------------------------------------------------------------------


def test_resolve_resume(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert resolve_resume(out, None) is None and resolve_resume(out, False) is None
    assert resolve_resume(out, "auto") is None  # no output dir yet: a fresh start
    first = small_checkpoint(out, 1)
    second = small_checkpoint(out, 2)
    assert resolve_resume(out, "auto") == second == resolve_resume(out, True)
    assert resolve_resume(out, str(first)) == first

    corrupt_byte(second / "model.safetensors")
    with pytest.warns(UserWarning, match="checkpoint-00000002"):
        assert resolve_resume(out, "auto") == first
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        resolve_resume(out, second)
    with pytest.raises(CheckpointError, match="manifest.json is missing.*pass one of its checkpoint-"):
        resolve_resume(out, out)
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_resume(out, out / "checkpoint-00000099")
    with pytest.raises(TypeError, match="resume_from_checkpoint"):
        resolve_resume(out, 3)  # type: ignore[arg-type]

    corrupt_byte(first / "model.safetensors")  # checkpoints exist, none good: refuse to restart silently
    with pytest.warns(UserWarning), pytest.raises(CheckpointError, match="start from scratch"):
        resolve_resume(out, "auto")


def test_resume_after_kill_continues_bit_exactly(tmp_path: Path) -> None:
    """Train 6 steps straight, versus 3 steps + checkpoint + a fresh process-like restart + 3 steps."""
    data = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))

    def build() -> tuple[Net, AdamW, lr.LinearWarmup]:
        model = make_net(seed=1)
        scheduler = lr.LinearWarmup(1e-2, warmup_steps=4, start_lr=0.0, end_lr=1e-2)
        return model, AdamW(learning_rate=scheduler, parameters=model.parameters()), scheduler

    def train(model: Net, opt: AdamW, scheduler: lr.LinearWarmup, steps: range) -> None:
        for _ in steps:
            rows = random.sample(range(64), 8)  # python RNG picks the batch,
            noise = torch.from_numpy(np.random.randn(8, 2).astype(np.float32))  # numpy adds label noise,
            loss = nn.functional.mse_loss(model(data[rows]), noise)  # torch RNG drives dropout
            loss.backward()
            opt.step()
            opt.clear_grad()
            scheduler.step()

    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    reference, ref_opt, ref_sched = build()
    train(reference, ref_opt, ref_sched, range(6))

    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    model, opt, scheduler = build()
    train(model, opt, scheduler, range(3))
    trainer_state = {"global_step": 3, "rng": capture_rng_state()}
    save_checkpoint(
        tmp_path,
        3,
        {"model": model.state_dict(), "optimizer": opt.state_dict(), "trainer_state": trainer_state},
    )
    del model, opt, scheduler  # the kill

    random.seed(123)  # a new process: generators elsewhere
    np.random.seed(123)
    torch.manual_seed(123)
    model, opt, scheduler = build()
    state = load_checkpoint(resolve_resume(tmp_path, "auto"))  # type: ignore[arg-type]
    model.load_state_dict(state["model"])
    opt.set_state_dict(state["optimizer"])
    restore_rng_state(state["trainer_state"]["rng"])
    train(model, opt, scheduler, range(state["trainer_state"]["global_step"], 6))

    for (name, p), q in zip(reference.named_parameters(), model.parameters(), strict=True):
        assert bits(p) == bits(q), name
    assert_identical(copy.deepcopy(ref_opt.state_dict()), opt.state_dict())

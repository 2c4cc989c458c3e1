"""``sampan.store.model_dir.ModelDir``: a model directory's layout, task.json, base chain and digest."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from sampan.store.model_dir import MODEL_FILES, TASK_FILE, ModelDir
from sampan.store.models import SHIPPED_DIR, model_file


def _write(directory: Path, files: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        (directory / name).write_bytes(data)
    return directory


def _full(directory: Path) -> Path:
    return _write(directory, {"config.json": {"hidden_size": 8}, "model.safetensors": b"weights",
                              "tokenizer.json": {"vocab": ["a"]}, "features.json": {"names": []}})


def _adapter(directory: Path, base: str, **meta) -> Path:
    return _write(directory, {TASK_FILE: {"task": "ner", "labels": ["O"], "method": "lora",
                                          "base_model_dir": base, **meta},
                              "adapter.safetensors": b"delta"})


def _old_digest(directory: Path, salt: str) -> str:
    """The export cache key as sampan.taskflow.runtime computed it before ModelDir owned it, but with
    task.json hashed canonically and without its ``ensemble`` entry (the n-gram half is never exported)."""
    h = hashlib.sha256(salt.encode())
    for name in ("config.json", "model.safetensors", "task.json", "adapter.safetensors", "features.json"):
        if (directory / name).is_file():
            h.update(name.encode())
            data = (directory / name).read_bytes()
            if name == "task.json":
                meta = {k: v for k, v in json.loads(data).items() if k != "ensemble"}
                data = json.dumps(meta, sort_keys=True, ensure_ascii=False).encode()
            h.update(data)
    meta = directory / "task.json"
    if meta.is_file():
        base = json.loads(meta.read_text(encoding="utf-8")).get("base_model_dir")
        if base:
            h.update(_old_digest((directory / base).resolve(), salt).encode())
    return h.hexdigest()[:16]


def test_full_model_dir_layout(tmp_path):
    model = ModelDir(_full(tmp_path / "base"))
    assert model.task_meta is None and not model.is_adapter and model.base is None
    assert model.chain() == (model,)
    assert model.file("tokenizer.json") == tmp_path / "base" / "tokenizer.json"
    assert model.file("nothing.json") is None
    assert model.config == {"hidden_size": 8}
    assert ModelDir(tmp_path).config is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.path = tmp_path  # type: ignore[misc]
    assert ModelDir(str(tmp_path / "base")) == model  # a str path is a Path


def test_adapter_over_a_base(tmp_path):
    _full(tmp_path / "base")
    adapter = ModelDir(_adapter(tmp_path / "task", "../base"))
    assert adapter.is_adapter and adapter.task_meta["labels"] == ["O"]
    assert adapter.base == ModelDir((tmp_path / "base").resolve())
    assert adapter.file("adapter.safetensors") == tmp_path / "task" / "adapter.safetensors"
    assert adapter.file("tokenizer.json") == (tmp_path / "base" / "tokenizer.json").resolve()
    assert adapter.config == {"hidden_size": 8}  # the base's
    assert model_file(tmp_path / "task", "features.json") == adapter.file("features.json")
    # its own copy wins over the base's
    _write(tmp_path / "task", {"tokenizer.json": {"vocab": ["b"]}})
    assert adapter.file("tokenizer.json") == tmp_path / "task" / "tokenizer.json"


def test_digest_keeps_the_export_cache_key(tmp_path):
    _full(tmp_path / "base")
    _adapter(tmp_path / "task", "../base")
    for directory in (tmp_path / "base", tmp_path / "task", *sorted(p for p in SHIPPED_DIR.iterdir() if p.is_dir())):
        assert ModelDir(directory).digest("1") == _old_digest(directory, "1"), directory
    before = ModelDir(tmp_path / "task").digest()
    meta = json.loads((tmp_path / "task" / "task.json").read_text(encoding="utf-8"))
    (tmp_path / "task" / "task.json").write_text(json.dumps({**meta, "ensemble": {"ngram_weight": 0.4}}))
    assert ModelDir(tmp_path / "task").digest() == before  # attaching the n-gram half re-exports nothing
    (tmp_path / "base" / "model.safetensors").write_bytes(b"retrained")  # a changed base changes the delta's key
    assert ModelDir(tmp_path / "task").digest() != before
    (tmp_path / "base" / "tokenizer.json").write_bytes(b"{}")  # not one of MODEL_FILES
    assert "tokenizer.json" not in MODEL_FILES
    assert ModelDir(tmp_path / "base").digest("1") == _old_digest(tmp_path / "base", "1")


def test_a_chain_of_bases(tmp_path):
    _full(tmp_path / "root")
    _adapter(tmp_path / "mid", "../root")
    top = ModelDir(_adapter(tmp_path / "top", "../mid"))
    assert [d.path.name for d in top.chain()] == ["top", "mid", "root"]
    assert top.file("config.json") == (tmp_path / "root" / "config.json").resolve()
    assert top.digest("1") == _old_digest(tmp_path / "top", "1")


def test_a_missing_base_is_a_clear_error(tmp_path):
    adapter = ModelDir(_adapter(tmp_path / "task", "../gone"))
    assert adapter.is_adapter
    with pytest.raises(FileNotFoundError, match=r"adapter for the base model at '\.\./gone'.*which is missing"):
        _ = adapter.base
    with pytest.raises(FileNotFoundError, match="which is missing"):
        adapter.file("tokenizer.json")
    with pytest.raises(FileNotFoundError, match="which is missing"):
        adapter.digest()


def test_a_loop_is_a_clear_error(tmp_path):
    _adapter(tmp_path / "a", "../b")
    _adapter(tmp_path / "b", "../a")
    with pytest.raises(ValueError, match="chain loops"):
        ModelDir(tmp_path / "a").chain()
    with pytest.raises(ValueError, match="chain loops"):
        ModelDir(tmp_path / "a").digest()
    _adapter(tmp_path / "self", ".")
    with pytest.raises(ValueError, match="points at the directory itself"):
        _ = ModelDir(tmp_path / "self").base


def test_bad_json_names_the_file(tmp_path):
    model = ModelDir(_write(tmp_path / "m", {TASK_FILE: b"{not json"}))
    with pytest.raises(ValueError, match=r"m/task\.json is not valid JSON"):
        _ = model.task_meta
    with pytest.raises(ValueError, match=r"m/task\.json is not valid JSON"):
        model.file("config.json")  # the chain is read from task.json
    with pytest.raises(ValueError, match=r"config\.json holds a JSON list, not an object"):
        _ = ModelDir(_write(tmp_path / "c", {"config.json": b"[1, 2]"})).config


def test_readers_go_through_model_dir(tmp_path):
    from sampan.finetune import read_task_meta

    with pytest.raises(FileNotFoundError, match="is not a fine-tuned model directory"):
        read_task_meta(tmp_path)
    _write(tmp_path, {TASK_FILE: b"{oops"})
    with pytest.raises(ValueError, match="not valid JSON"):
        read_task_meta(tmp_path)
    _write(tmp_path, {TASK_FILE: {"task": "ner"}})
    with pytest.raises(ValueError, match="lacks 'labels'"):
        read_task_meta(tmp_path)

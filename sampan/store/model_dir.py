"""``ModelDir``: the one reader of a model directory's layout (imports nothing from sampan).

A model directory holds ``config.json`` + ``model.safetensors`` (``save_pretrained``) or, for a
task model kept as a delta over its base, ``adapter.safetensors`` and a ``task.json`` whose
``base_model_dir`` names the base directory relative to this one. Such a delta keeps no tokenizer,
config or features of its own: they are read from the base chain. ``task.json`` is written by
``sampan finetune`` (and rewritten by the hub's recipes and ``hub evaluate``), always as
``TASK_FILE``; every reader goes through ``ModelDir``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sampan.utils.json_file import read_json_object

TASK_FILE = "task.json"
CONFIG_FILE = "config.json"
# Files whose bytes define a stored model (an export of it depends on nothing else): what
# ``ModelDir.digest`` hashes, in this order.
MODEL_FILES = (CONFIG_FILE, "model.safetensors", TASK_FILE, "adapter.safetensors", "features.json")


@dataclass(frozen=True)
class ModelDir:
    """A model directory: its ``task.json``, its base chain and the files the chain holds.

    Nothing is cached: every property reads the files as they are now.
    """

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @property
    def task_file(self) -> Path:
        return self.path / TASK_FILE

    @property
    def task_meta(self) -> dict[str, Any] | None:
        """``task.json`` parsed, or None when the directory has none; bad JSON is a ValueError naming the file."""
        return read_json_object(self.task_file) if self.task_file.is_file() else None

    @property
    def base_model_dir(self) -> str | None:
        """``task.json``'s ``base_model_dir`` as written (relative to this directory), or None."""
        return (self.task_meta or {}).get("base_model_dir") or None

    @property
    def is_adapter(self) -> bool:
        """Whether this directory is a delta over a base (``task.json`` names a ``base_model_dir``)."""
        return self.base_model_dir is not None

    @property
    def base(self) -> ModelDir | None:
        """The base this directory is a delta over (``base_model_dir`` resolved against it), or None.

        A base that is not a directory, or that is this directory itself, is an error naming both.
        """
        relative = self.base_model_dir
        if relative is None:
            return None
        base = (self.path / relative).resolve()
        if not base.is_dir():
            raise FileNotFoundError(f"{self.path} is an adapter for the base model at {relative!r} (relative to it: "
                                    f"{base}), which is missing; ship the two directories together or save with "
                                    "save='merged'")
        if base == self.path.resolve():
            raise ValueError(f"{self.task_file}: base_model_dir {relative!r} points at the directory itself")
        return ModelDir(base)

    def chain(self) -> tuple[ModelDir, ...]:
        """This directory, then its base, its base's base, ...; a cycle is a ValueError naming it."""
        dirs = [self]
        seen = {self.path.resolve()}
        while (base := dirs[-1].base) is not None:
            if base.path in seen:
                names = " -> ".join(str(d.path) for d in (*dirs, base))
                raise ValueError(f"{self.path}: the base_model_dir chain loops ({names})")
            seen.add(base.path)
            dirs.append(base)
        return tuple(dirs)

    def file(self, name: str) -> Path | None:
        """File ``name`` of this directory, else of the nearest base in the chain that has it; None if none has."""
        for model_dir in self.chain():
            if (model_dir.path / name).is_file():
                return model_dir.path / name
        return None

    @property
    def config(self) -> dict[str, Any] | None:
        """``config.json`` parsed (this directory's, else the base chain's), or None when none has one."""
        found = self.file(CONFIG_FILE)
        return read_json_object(found) if found else None

    def digest(self, salt: str = "") -> str:
        """16 hex digits of a sha256 over ``salt`` and the bytes of this directory's ``MODEL_FILES``,
        folding in the base's digest (same salt) for a delta: what an export cache is keyed by.
        ``task.json``'s ``ensemble`` entry is left out: the n-gram half is read from the model
        directory at run time, never exported, so attaching it does not make the ERNIE export again."""
        folded = ""
        for model_dir in reversed(self.chain()):  # the last base first: each delta folds in its base's digest
            h = hashlib.sha256(salt.encode())
            for name in MODEL_FILES:
                path = model_dir.path / name
                if path.is_file():
                    h.update(name.encode())
                    h.update(_exported_bytes(path))
            if folded:
                h.update(folded.encode())
            folded = h.hexdigest()[:16]
        return folded


def _exported_bytes(path: Path) -> bytes:
    """What of a model file the export depends on: its bytes; for ``task.json``, its keys but
    ``ensemble``, in one canonical form (so attaching the n-gram half changes no key)."""
    data = path.read_bytes()
    if path.name != TASK_FILE:
        return data
    meta = json.loads(data.decode("utf-8"))
    if isinstance(meta, dict):
        meta.pop("ensemble", None)
    return json.dumps(meta, sort_keys=True, ensure_ascii=False).encode()

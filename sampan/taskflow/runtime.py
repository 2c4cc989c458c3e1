"""From a stored model to a running predictor: export once to a cached inference directory.

Taskflow never runs the eager model: it exports the stored model (``sampan.inference.export_pretrained``,
i.e. ``jit.save``'s ONNX graph) the first time it is used and runs ONNX Runtime through
``sampan.inference``'s predictor after that. The export is cached under
``$SAMPAN_HOME/cache/inference/<name>-<digest>``, keyed by a hash of the model's files, so a rebuilt
model is exported again and a shipped one only once per machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sampan.store.model_dir import ModelDir
from sampan.store.models import resolve
from sampan.text.tokenizer import ChineseTokenizer
from sampan.utils.atomic import file_lock
from sampan.utils.paths import cache_dir

_EXPORT_VERSION = "2"  # bump when the exported signature changes, to invalidate old caches (2: decode graphs)
_lock = threading.Lock()


@dataclass
class LoadedModel:
    """A stored model ready to run: its predictor, tokenizer, and what ``task.json`` / ``config.json`` say."""

    name: str
    directory: Path
    predictor: Any
    tokenizer: ChineseTokenizer
    task_meta: dict[str, Any]
    config: dict[str, Any]
    inference_dir: Path


def _digest(directory: Path) -> str:
    """The export cache key: the bytes of the files that define the model, across its base chain."""
    return ModelDir(directory).digest(_EXPORT_VERSION)


def eager_model(directory: Path):
    """The stored model as an fp32 eval-mode torch module (``sampan.inference.load_model_dir``)."""
    from sampan.inference.pretrained import load_model_dir

    return load_model_dir(directory)


def export_dir(name: str, directory: Path) -> Path:
    """The cached inference directory of a stored model, exporting it first if needed."""

    def export(out: Path) -> None:  # torch is imported only when exporting: a cached model runs without it
        from sampan.inference import export_pretrained
        from sampan.inference.pretrained import model_features

        export_pretrained(eager_model(directory), out, overwrite=True, features=model_features(directory))

    target = cache_dir("inference", f"{directory.name}-{_digest(directory)}")
    return cached_export(name, target, export)


def files_digest(directory: Path, version: str, names: tuple[str, ...] = ("config.json", "model.safetensors")) -> str:
    """An export cache key from ``version`` and the bytes of ``names`` in ``directory`` (the image
    models, whose directory is one config and one weight file)."""
    import hashlib

    from sampan.utils.digest import file_sha256

    h = hashlib.sha256(version.encode())
    for name in names:
        if (directory / name).is_file():
            h.update(f"{name}:{file_sha256(directory / name)};".encode())
    return h.hexdigest()[:16]


def cached_export(name: str, target: Path, export: Callable[[Path], None]) -> Path:
    """``target`` (an inference directory in the export cache), made by ``export(target)`` unless it
    is there already. One export at a time, across threads and processes (the workers of `sampan
    serve --workers N` start together): the others wait, then find it made; exports are atomic on disk."""
    if (target / "inference.onnx").is_file() and (target / "inference.json").is_file():
        return target
    with _lock, file_lock(target.parent / f".{target.name}.lock"):
        if not (target / "inference.onnx").is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            print(f"sampan: exporting {name} for inference (once per model) -> {target}", file=sys.stderr)
            with quiet_exporter():
                export(target)
    return target


@contextlib.contextmanager
def quiet_exporter():
    """The ONNX exporter logs torchvision notes and deprecation warnings that say nothing to a
    Taskflow user; errors still raise."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            yield
    finally:
        logger.setLevel(level)


def load(name: str, precision: str = "fp32", num_threads: int | None = None,
         backend: str = "onnxruntime", device: str = "cpu") -> LoadedModel:
    """Resolve ``name`` in the store, export it if needed, and open a predictor on the export on
    ``device`` (a spec, ``sampan.inference.Config.device``). The export itself is made on the CPU
    and is the same file for every device."""
    from sampan.inference import Config, create_predictor

    directory = resolve(name)
    inference = export_dir(name, directory)
    config = Config(str(inference), backend=backend, num_threads=num_threads or _default_threads(),
                    precision=precision, device=device)
    model_dir = ModelDir(directory)
    tokenizer_path = model_dir.file("tokenizer.json")
    if tokenizer_path is None:
        raise FileNotFoundError(f"{directory} has no tokenizer.json; rebuild it with `sampan hub build {name}`")
    return LoadedModel(name, directory, create_predictor(config), ChineseTokenizer.load(tokenizer_path),
                       model_dir.task_meta or {}, model_dir.config or {}, inference)


def _default_threads() -> int:
    # ONNX Runtime's default spins one thread per core; leave it to the cores this process may use.
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)

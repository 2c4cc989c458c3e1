"""Saving and loading models as ``config.json`` + ``model.safetensors`` (never pickle)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sampan.models.config_base import ModelConfig
from sampan.tensor import DTypeLike, to_dtype

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

# architecture name -> class; filled by PretrainedModel.__init_subclass__.
ARCHITECTURES: dict[str, type[PretrainedModel]] = {}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PretrainedModel(torch.nn.Module):
    """Mixin for sampan models: ``config``, ``save_pretrained`` and ``from_pretrained``.

    Subclasses set ``config_class`` and ``head`` (the name ``create(..., head=)`` uses).
    """

    config_class: ClassVar[type[ModelConfig]]
    head: ClassVar[str] = ""
    config: ModelConfig

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "config_class" in cls.__dict__:
            ARCHITECTURES[cls.__name__] = cls

    def num_parameters(self) -> int:
        """Parameters actually held (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    def tie_weights(self) -> None:
        """Re-share tied parameters; ``to_empty`` after meta construction unties them."""

    def tied_weights(self) -> dict[str, str]:
        """Map of parameter names that are aliases to the name actually stored."""
        seen: dict[int, str] = {}
        aliases: dict[str, str] = {}
        for name, param in self.named_parameters(remove_duplicate=False):
            if id(param) in seen:
                aliases[name] = seen[id(param)]
            else:
                seen[id(param)] = name
        return aliases

    def save_pretrained(self, save_directory: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` to ``save_directory`` atomically.

        Files are written into a temporary sibling directory, fsynced, then renamed into place,
        so a crash never leaves a half-written model where a loader would find it. An existing
        directory is replaced.
        """
        target = Path(save_directory)
        target.parent.mkdir(parents=True, exist_ok=True)
        if any(t.is_meta for t in self.state_dict().values()):
            raise ValueError("cannot save a model on the meta device: materialise it (model.to_empty) first")
        tied = self.tied_weights()
        tensors = {
            name: tensor.detach().to("cpu").contiguous()
            for name, tensor in self.state_dict().items()
            if name not in tied
        }
        config = {**self.config.to_dict(), "architecture": type(self).__name__}
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            save_file(tensors, str(tmp / WEIGHTS_NAME), metadata={"format": "pt", "producer": "sampan"})
            with open(tmp / CONFIG_NAME, "w", encoding="utf-8") as f:
                f.write(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False))
                f.flush()
                os.fsync(f.fileno())
            with open(tmp / WEIGHTS_NAME, "rb") as f:
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            if target.exists():
                backup = target.with_name(f".{target.name}.old")
                shutil.rmtree(backup, ignore_errors=True)
                target.rename(backup)
                tmp.rename(target)
                shutil.rmtree(backup)
            else:
                tmp.rename(target)
            _fsync_dir(target.parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return target

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, device: str | torch.device | None = None,
                        dtype: DTypeLike = None):
        """Load a model saved by ``save_pretrained`` (also through a base class: it dispatches)."""
        return from_pretrained(directory, device=device, expected=cls, dtype=dtype)


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The raw ``config.json`` of a saved model, with a clear error when it is missing."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {directory} is not a sampan model directory "
            "(expected config.json and model.safetensors written by save_pretrained)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def _saved_float_dtype(path: Path) -> torch.dtype | None:
    """The dtype of the first floating tensor in a safetensors file (None if it has none)."""
    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            dtype = f.get_slice(name).get_dtype()
            mapped = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
                      "F64": torch.float64}.get(dtype)
            if mapped is not None:
                return mapped
    return None


def from_pretrained(directory: str | os.PathLike, device: str | torch.device | None = None,
                    expected: type[torch.nn.Module] | None = None, dtype: DTypeLike = None) -> PretrainedModel:
    """Build the model described by ``directory/config.json`` and load its safetensors weights.

    The model takes the dtype the weights were saved in unless ``dtype`` asks for another.
    Loading is strict: a missing or unexpected tensor, or one of the wrong shape, is an error
    that names it. Nothing is unpickled.
    """
    data = read_config(directory)
    arch = data.pop("architecture", None)
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r} in {directory}/config.json; known: {sorted(ARCHITECTURES)}")
    model_cls = ARCHITECTURES[arch]
    if expected is not None and not issubclass(model_cls, expected):
        raise TypeError(f"{directory} holds a {arch}, which is not a {expected.__name__}")
    config = model_cls.config_class.from_dict(data)
    weights = Path(directory) / WEIGHTS_NAME
    target_dtype = to_dtype(dtype) or _saved_float_dtype(weights) or torch.get_default_dtype()
    with torch.device("meta"):
        model = model_cls(config)
    model.to(dtype=target_dtype)
    model.to_empty(device=device or "cpu")
    model.tie_weights()
    load_safetensors(model, weights)
    return model.eval()


def load_safetensors(model: torch.nn.Module, path: Path, partial: bool = False) -> set[str]:
    """Copy every tensor of ``path`` into ``model``; tied aliases are re-tied, not loaded twice.

    The file must hold exactly the model's tensors, or with ``partial=True`` a subset of them (a
    delta such as a fine-tune's ``adapter.safetensors``). Returns the names loaded.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (save_pretrained writes model.safetensors)")
    tied = model.tied_weights() if hasattr(model, "tied_weights") else set()
    expected = {k: v for k, v in model.state_dict().items() if k not in tied}
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        missing, unexpected = sorted(set(expected) - names), sorted(names - set(expected))
        if (missing and not partial) or unexpected:
            raise ValueError(f"{path} does not match the model: missing {missing[:10]}, unexpected {unexpected[:10]}")
        with torch.no_grad():
            for name in sorted(names):
                tensor = f.get_tensor(name)
                if tensor.shape != expected[name].shape:
                    raise ValueError(f"{path}: {name} has shape {tuple(tensor.shape)}, "
                                     f"the model expects {tuple(expected[name].shape)}")
                expected[name].copy_(tensor)
    return names

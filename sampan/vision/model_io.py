"""Saving and loading the vision models: ``config.json`` (the typed config, nested dataclasses as
objects) + ``model.safetensors``, written atomically as one directory; nothing is unpickled."""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from sampan.utils.atomic import atomic_dir

C = TypeVar("C")
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def config_to_dict(config: Any) -> dict:
    """A config dataclass (nested ones too) as JSON-ready data."""
    return dataclasses.asdict(config)


def config_from_dict(cls: type[C], data: dict) -> C:
    """Rebuild ``cls`` from :func:`config_to_dict`'s output; an unknown key is an error naming it."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in data.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind) and isinstance(value, dict):
            value = config_from_dict(kind, value)
        values[name] = value
    return cls(**values)


def save_model(model: torch.nn.Module, config: Any, model_type: str, directory: str | os.PathLike,
               extra_text: dict[str, str] | None = None) -> Path:
    """Write ``config.json`` (with ``model_type``), ``model.safetensors`` and the ``extra_text`` files
    (name -> contents, e.g. the recogniser's ``charset.txt``) into ``directory`` (replaced as a whole,
    atomically)."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with atomic_dir(directory) as tmp:
        payload = {"model_type": model_type, **config_to_dict(config)}
        (tmp / CONFIG_NAME).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        save_file(state, str(tmp / WEIGHTS_NAME))
        for name, text in (extra_text or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
    return Path(directory)


def load_config(cls: type[C], model_type: str, directory: str | os.PathLike) -> C:
    """The config saved by :func:`save_model`; a directory of another model type is an error."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass a directory written by save_pretrained")
    data = json.loads(path.read_text(encoding="utf-8"))
    found = data.pop("model_type", None)
    if found != model_type:
        raise ValueError(f"{path} holds model_type {found!r}, not {model_type!r}")
    return config_from_dict(cls, data)


def load_weights(model: torch.nn.Module, directory: str | os.PathLike) -> None:
    """Load ``model.safetensors`` into ``model`` (strict: missing or extra names are errors)."""
    path = Path(directory) / WEIGHTS_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: pass a directory written by save_pretrained")
    model.load_state_dict(load_file(str(path)), strict=True)


def check_images(images: torch.Tensor, channels: int, who: str, min_height: int = 1, multiple: int = 1) -> None:
    """A clear error for a batch that is not ``(N, channels, H >= min_height, W >= 1)`` with both sides
    multiples of ``multiple``.

    Skipped while torch traces or exports the model: the exported graph carries its own input shapes.
    """
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"{who} takes a batch of images (N, {channels}, H, W), got {shape}")
    if images.shape[1] != channels:
        raise ValueError(f"{who} expects {channels} channels, got {images.shape[1]} (shape {tuple(images.shape)}): "
                         f"convert the images to {'RGB' if channels == 3 else f'{channels} channels'} first")
    if images.shape[0] == 0 or images.shape[2] < min_height or images.shape[3] == 0:
        raise ValueError(f"{who} got an empty or too small batch {tuple(images.shape)}: "
                         f"each image needs height >= {min_height} and width >= 1")
    if images.shape[2] % multiple or images.shape[3] % multiple:
        raise ValueError(f"{who} needs height and width that are multiples of {multiple}, got "
                         f"{tuple(images.shape[2:])}: resize or pad the images (detect() does)")


def to_rgb(image, who: str) -> Image.Image:
    """A PIL image or an ``(H, W, 3)`` uint8 array as a non-empty RGB PIL image; a clear error otherwise."""
    if isinstance(image, Image.Image):
        if image.size[0] == 0 or image.size[1] == 0:
            raise ValueError(f"{who} got an empty image ({image.size[0]}x{image.size[1]})")
        return image.convert("RGB")
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"{who} takes RGB images: a PIL image or an (H, W, 3) uint8 array, got shape "
                         f"{array.shape}; convert grey or RGBA images with Image.convert('RGB')")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{who} got an empty image of shape {array.shape}")
    if array.dtype != np.uint8:
        raise ValueError(f"{who} takes uint8 pixels (0-255), got {array.dtype}")
    return Image.fromarray(array, "RGB")

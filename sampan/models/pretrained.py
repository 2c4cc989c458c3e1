"""Saving and loading models: sampan's directories and Hugging Face's, both never through pickle.

A sampan directory holds ``config.json`` (the sampan config plus ``architecture``, the head's
class) and ``model.safetensors`` (or shards with an index). A Hugging Face directory holds HF's
``config.json`` (``model_type``, ``architectures``) and the same weight files under HF's tensor
names; ``from_pretrained`` opens either, and ``save_pretrained(format="hf")`` writes the second
kind, which ``transformers`` opens with no conversion step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar

import torch

from sampan.models.config_base import ModelConfig
from sampan.models.loading import build_empty, load_tensors
from sampan.models.loading import load_safetensors as load_safetensors  # re-exported
from sampan.models.weight_files import (
    DEFAULT_MAX_SHARD_SIZE,
    SAFETENSORS,
    iter_tensors,
    stored_float_dtype,
    weight_files,
    write_weights,
)
from sampan.tensor import DTypeLike, to_dtype
from sampan.utils.atomic import atomic_dir
from sampan.utils.json_file import read_json_object

CONFIG_NAME = "config.json"
WEIGHTS_NAME = SAFETENSORS
FORMATS = ("sampan", "hf")

# architecture name -> class; filled by PretrainedModel.__init_subclass__.
ARCHITECTURES: dict[str, type[PretrainedModel]] = {}


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

    def save_pretrained(self, save_directory: str | os.PathLike, format: str = "sampan",
                        max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, tokenizer: Any = None) -> Path:
        """Write the model to ``save_directory`` atomically and return its path.

        ``format="sampan"`` (default) writes sampan's ``config.json`` and weights; ``format="hf"``
        writes a Hugging Face directory (HF config and tensor names) that ``transformers``'
        ``AutoModelFor...`` classes open as they are. Weights above ``max_shard_size`` (bytes, or
        a string such as ``"2GB"``) are split into shards with an index file. ``tokenizer``, when
        given, writes its files beside the weights (``tokenizer.save_pretrained(dir)``; sampan's
        tokenizers write the files ``AutoTokenizer`` reads).

        Everything is written into a temporary sibling directory, fsynced, then renamed into
        place, so a crash never leaves a half-written model where a loader would find it. An
        existing directory is replaced.
        """
        if format not in FORMATS:
            raise ValueError(f"format must be one of {list(FORMATS)}, got {format!r}")
        if any(t.is_meta for t in self.state_dict().values()):
            raise ValueError("cannot save a model on the meta device: materialise it (model.to_empty) first")
        if tokenizer is not None and not hasattr(tokenizer, "save_pretrained"):
            raise TypeError(f"tokenizer must have save_pretrained(directory), got {type(tokenizer).__name__}")
        tied = self.tied_weights()
        state = {name: tensor.detach() for name, tensor in self.state_dict().items() if name not in tied}
        if format == "hf":
            from sampan.models.hf_checkpoint import check_tokenizer, hf_config_and_state

            config, state = hf_config_and_state(self, state)
            if tokenizer is not None:
                check_tokenizer(self, tokenizer)
        else:
            config = {**self.config.to_dict(), "architecture": type(self).__name__}
        with atomic_dir(save_directory) as tmp:
            write_weights(state, tmp, max_shard_size, metadata={"producer": "sampan"})
            (tmp / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                                           encoding="utf-8")
            if format == "hf":
                from sampan.models.hf_checkpoint import write_generation_config

                write_generation_config(self.config, tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
        return Path(save_directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, device: str | torch.device | None = None,
                        dtype: DTypeLike = None, head: str | None = None):
        """Load a sampan or Hugging Face model directory (also through a base class: it dispatches)."""
        return from_pretrained(directory, device=device, expected=cls, dtype=dtype, head=head)


def read_config(directory: str | os.PathLike) -> dict[str, Any]:
    """The raw ``config.json`` of a saved model, with a clear error when it is missing or unreadable."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: {directory} is not a model directory (expected config.json and "
            "model.safetensors, written by save_pretrained or by Hugging Face transformers)"
        )
    return read_json_object(path)


def is_sampan_directory(config: dict[str, Any]) -> bool:
    """Whether a ``config.json`` is sampan's (it names one ``architecture``; HF's lists ``architectures``)."""
    return "architecture" in config


def from_pretrained(directory: str | os.PathLike, device: str | torch.device | None = None,
                    expected: type[torch.nn.Module] | None = None, dtype: DTypeLike = None,
                    head: str | None = None) -> PretrainedModel:
    """Build the model a directory describes and load its weights.

    Opens sampan's directories and Hugging Face's (``model_type`` gpt2, llama, qwen2, qwen3,
    bert, ernie): single or sharded safetensors, or a ``pytorch_model.bin`` read with
    ``weights_only=True``. The model takes the dtype the weights were stored in unless ``dtype``
    asks for another. ``head`` picks the head of an HF checkpoint (default: from its
    ``architectures``); a sampan directory's head is fixed by what was saved. Loading is
    strict: a missing or unexpected tensor, or one of the wrong shape, is an error that names it.
    """
    data = read_config(directory)
    if not is_sampan_directory(data):
        from sampan.models.hf_checkpoint import load_hf_model

        model = load_hf_model(directory, data, head=head, device=device, dtype=dtype)
    else:
        from sampan.models.registry import architecture_class, architecture_names

        arch = data.pop("architecture")
        # A family's classes load on first use; a user's own subclass registered itself on definition.
        model_cls = ARCHITECTURES.get(arch) or (architecture_class(arch) if isinstance(arch, str) else None)
        if model_cls is None:
            known = sorted(set(ARCHITECTURES) | set(architecture_names()))
            raise ValueError(f"unknown architecture {arch!r} in {directory}/config.json; known: {known}")
        if head is not None and head != model_cls.head:
            raise ValueError(f"{directory} holds a {arch} (head {model_cls.head!r}), not head {head!r}; a sampan "
                             "directory loads with the head it was saved with")
        config = model_cls.config_class.from_dict(data)
        files = weight_files(directory)
        model = build_empty(model_cls, config, device, to_dtype(dtype) or stored_float_dtype(files))
        load_tensors(model, iter_tensors(files), str(directory))
    if expected is not None and not isinstance(model, expected):
        raise TypeError(f"{directory} holds a {type(model).__name__}, which is not a {expected.__name__}")
    return model.eval()

"""Filling a model with tensors: build it with no storage, then copy each tensor in, strictly.

The one loader under every format: ``pretrained.py`` (sampan directories), ``hf_checkpoint.py``
(Hugging Face ones, through each family's name map) and fine-tuned task models all end here, so
what counts as a mismatch (a missing, unexpected, twice-given or wrongly shaped tensor, a tied
alias that differs) is decided once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from sampan.models.config_base import ModelConfig
from sampan.models.weight_files import iter_tensors

if TYPE_CHECKING:  # pragma: no cover - annotations only; pretrained.py imports this module
    from sampan.models.pretrained import PretrainedModel


def build_empty(model_cls: type[PretrainedModel], config: ModelConfig, device: str | torch.device | None,
                dtype: torch.dtype | None) -> PretrainedModel:
    """``model_cls(config)`` with uninitialised storage on ``device`` (built on meta: no init cost)."""
    with torch.device("meta"):
        model = model_cls(config)
    model.to(dtype=dtype or torch.get_default_dtype())
    model.to_empty(device=device or "cpu")
    model.tie_weights()
    return model


def load_tensors(model: torch.nn.Module, tensors, source: str, partial: bool = False,
                 unknown: list[str] | None = None) -> set[str]:
    """Copy ``(name, tensor)`` pairs into ``model``; returns the names loaded.

    Every tensor of the model must come, unless ``partial`` (a delta such as a fine-tune's
    adapter file); one given twice must be equal both times. A tied alias (an MLM decoder or
    LM head that shares the embedding) is not loaded twice: when the source holds it too, it
    must equal the weight it is tied to. ``unknown`` collects source names the caller could not
    map while ``tensors`` ran; they are reported with the rest. Errors name the tensors and
    ``source``.
    """
    tied = model.tied_weights() if hasattr(model, "tied_weights") else {}
    expected = {k: v for k, v in model.state_dict().items() if k not in tied}
    loaded: set[str] = set()
    aliases: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    with torch.no_grad():
        for name, tensor in tensors:
            if name in tied:
                aliases[name] = tensor
                continue
            if name not in expected:
                unexpected.append(name)
                continue
            if name in loaded:
                if not torch.equal(tensor.to(expected[name].dtype), expected[name]):
                    raise ValueError(f"{source}: tensor {name} is given twice, with different values")
                continue
            if tensor.shape != expected[name].shape:
                raise ValueError(f"{source}: {name} has shape {tuple(tensor.shape)}, "
                                 f"the model expects {tuple(expected[name].shape)}")
            expected[name].copy_(tensor)
            loaded.add(name)
        unexpected += unknown or []
        missing = sorted(set(expected) - loaded)
        if (missing and not partial) or unexpected:
            raise ValueError(f"{source} does not match the model ({type(model).__name__}): "
                             f"missing {missing[:10]}{' ...' if len(missing) > 10 else ''}, "
                             f"unexpected {sorted(unexpected)[:10]}{' ...' if len(unexpected) > 10 else ''}")
        for alias, tensor in aliases.items():
            target = expected[tied[alias]]
            if tensor.shape != target.shape or not torch.equal(tensor.to(target.dtype), target):
                raise ValueError(f"{source}: {alias} differs from {tied[alias]}, which this model ties it to; a "
                                 "checkpoint with an untied output layer needs a config with tie_word_embeddings=False")
    return loaded


def load_safetensors(model: torch.nn.Module, path: Path, partial: bool = False) -> set[str]:
    """Copy every tensor of one safetensors file into ``model`` (see :func:`load_tensors`)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} not found (save_pretrained writes model.safetensors)")
    return load_tensors(model, iter_tensors([Path(path)]), str(path), partial=partial)

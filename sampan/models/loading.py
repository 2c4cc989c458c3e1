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

    An item may also be ``(name, tensor, index)``: ``tensor`` fills ``model_tensor[index]`` (an
    int or a tuple of ints / slices), so a checkpoint that stores one tensor per expert fills a
    model that keeps all experts in one ``[experts, ...]`` tensor, piece by piece, as the
    checkpoint streams. The tensor counts as loaded once its pieces cover every element.
    """
    tied = model.tied_weights() if hasattr(model, "tied_weights") else {}
    expected = {k: v for k, v in model.state_dict().items() if k not in tied}
    loaded: set[str] = set()
    pieces: dict[str, dict[str, int]] = {}  # name -> {repr(index): elements it covers}
    aliases: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    with torch.no_grad():
        for item in tensors:
            name, tensor = item[0], item[1]
            index = item[2] if len(item) > 2 else None
            if name in tied:
                aliases[name] = tensor
                continue
            if name not in expected:
                unexpected.append(name)
                continue
            if index is not None:
                _load_piece(expected[name], name, tensor, index, pieces.setdefault(name, {}), source)
                if sum(pieces[name].values()) == expected[name].numel():
                    loaded.add(name)
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
        partly = {n: f"{sum(p.values())}/{expected[n].numel()} elements" for n, p in pieces.items() if n not in loaded}
        missing = sorted(set(expected) - loaded)
        if (missing and not partial) or unexpected:
            shown = [f"{n} (only {partly[n]})" if n in partly else n for n in missing[:10]]
            raise ValueError(f"{source} does not match the model ({type(model).__name__}): "
                             f"missing {shown}{' ...' if len(missing) > 10 else ''}, "
                             f"unexpected {sorted(unexpected)[:10]}{' ...' if len(unexpected) > 10 else ''}")
        for alias, tensor in aliases.items():
            target = expected[tied[alias]]
            if tensor.shape != target.shape or not torch.equal(tensor.to(target.dtype), target):
                raise ValueError(f"{source}: {alias} differs from {tied[alias]}, which this model ties it to; a "
                                 "checkpoint with an untied output layer needs a config with tie_word_embeddings=False")
    return loaded


def _load_piece(target: torch.Tensor, name: str, tensor: torch.Tensor, index, seen: dict[str, int],
                source: str) -> None:
    """Copy ``tensor`` into ``target[index]``; a piece given twice must be equal both times.

    Pieces must not overlap (each checkpoint tensor is a distinct slice, such as one expert), so
    counting the elements each covers tells when the whole tensor has arrived."""
    view = target[index]
    key = repr(index)
    if tensor.shape != view.shape:
        raise ValueError(f"{source}: a piece of {name} at {key} has shape {tuple(tensor.shape)}, "
                         f"the model expects {tuple(view.shape)}")
    if key in seen:
        if not torch.equal(tensor.to(view.dtype), view):
            raise ValueError(f"{source}: the piece of {name} at {key} is given twice, with different values")
        return
    view.copy_(tensor)
    seen[key] = view.numel()


def load_safetensors(model: torch.nn.Module, path: Path, partial: bool = False) -> set[str]:
    """Copy every tensor of one safetensors file into ``model`` (see :func:`load_tensors`)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} not found (save_pretrained writes model.safetensors)")
    return load_tensors(model, iter_tensors([Path(path)]), str(path), partial=partial)

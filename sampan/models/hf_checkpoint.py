"""Hugging Face checkpoint directories in and out, through each family's adapter (its ``hf.py``).

The generic part lives here: find the family from ``model_type``, stream the weights through
the adapter's name map into a model built on the meta device, and the reverse for export. What
is specific to a family (config fields, tensor names, fused projections) lives in its adapter.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from sampan.models.config_base import ModelConfig
from sampan.models.loading import build_empty, load_tensors
from sampan.models.registry import spec_for_hf_model_type, spec_of
from sampan.models.weight_files import iter_tensors, stored_float_dtype, tensor_names, weight_files
from sampan.tensor import DTypeLike, to_dtype

GENERATION_CONFIG = "generation_config.json"


def load_hf_model(directory: str | os.PathLike, hf_config: Mapping[str, Any], head: str | None = None,
                  device: str | torch.device | None = None, dtype: DTypeLike = None):
    """The sampan model for a Hugging Face directory whose ``config.json`` is ``hf_config``."""
    directory = Path(directory)
    model_type = hf_config.get("model_type")
    if not isinstance(model_type, str):
        raise ValueError(f"{directory}/config.json has no model_type: it is neither a sampan model directory "
                         "(which names an 'architecture') nor a Hugging Face one")
    spec = spec_for_hf_model_type(model_type)
    adapter = spec.hf_adapter()
    try:
        config = adapter.config_from_hf(hf_config)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{directory}/config.json: {err}") from err
    files = weight_files(directory)
    if head is None:
        head = adapter.head_from_hf(hf_config, tensor_names(files))
    else:
        head = config._check_head(head)
    model = build_empty(spec.model_class(head), config, device, to_dtype(dtype) or stored_float_dtype(files))
    unknown: list[str] = []
    load_tensors(model, _mapped(adapter, iter_tensors(files), config, head, unknown),
                 f"{directory} ({model_type} checkpoint as sampan's {type(model).__name__})", unknown=unknown)
    return model


def _mapped(adapter, tensors: Iterator[tuple[str, torch.Tensor]], config: ModelConfig, head: str,
            unknown: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """The adapter's sampan names for ``tensors``; names it does not know go to ``unknown``."""
    for name, tensor in tensors:
        try:
            yield from adapter.tensor_from_hf(name, tensor, config, head)
        except KeyError:
            unknown.append(f"{name} (HF name)")


def hf_config_and_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> tuple[dict, dict]:
    """The HF ``config.json`` and state dict of a sampan model (for ``save_pretrained(format="hf")``)."""
    spec = spec_of(model)
    if spec is None:
        raise ValueError(f"{type(model).__name__} belongs to no sampan model family: only sampan's models "
                         "save in Hugging Face format")
    adapter = spec.hf_adapter()
    head = type(model).head
    config = adapter.config_to_hf(model.config, head)
    floats = {t.dtype for t in state.values() if t.is_floating_point()}
    if len(floats) == 1:
        config["torch_dtype"] = str(next(iter(floats))).removeprefix("torch.")
    return config, adapter.state_to_hf(state, model.config, head)


def check_tokenizer(model: torch.nn.Module, tokenizer: Any) -> None:
    """Refuse a tokenizer that ``transformers`` would read differently beside this model (the family
    adapter's ``tokenizer_problem`` says when)."""
    spec = spec_of(model)
    problem = getattr(spec.hf_adapter(), "tokenizer_problem", None) if spec is not None else None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else (tokenizer.to_json() if hasattr(tokenizer, "to_json") else None)
    if problem is None or text is None:
        return
    reason = problem(model.config, json.loads(text))
    if reason:
        raise ValueError(f"cannot save this tokenizer with the model in Hugging Face format: {reason}")


def write_generation_config(config: ModelConfig, directory: Path) -> None:
    """``generation_config.json`` with the special ids, as transformers' ``generate`` reads them."""
    ids = {key: getattr(config, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    ids = {k: v for k, v in ids.items() if v is not None}
    if ids:
        (directory / GENERATION_CONFIG).write_text(json.dumps(ids, indent=2, sort_keys=True) + "\n", encoding="utf-8")

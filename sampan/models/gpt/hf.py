"""GPT's Hugging Face adapter: ``gpt2`` checkpoints (``GPT2LMHeadModel`` / ``GPT2Model``), both ways.

GPT-2 stores its projections as ``Conv1D`` (weights ``[in, out]``, the transpose of
``nn.Linear``'s) and fuses q / k / v into one ``c_attn``; sampan keeps three ``nn.Linear`` so
tensor parallelism can split heads, so import splits and transposes, and export fuses back.
Importing this module imports no torch (the planner reads HF configs through it).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

from sampan.models.gpt.config import GPTConfig
from sampan.models.hf_names import ACTIVATIONS_TO_HF, activation_from_hf, head_from_architectures

HEAD_SUFFIXES = {"LMHeadModel": "causal_lm", "Model": "none"}
HEAD_ARCHITECTURE = {"causal_lm": "GPT2LMHeadModel", "none": "GPT2Model"}
CONFIG_FIELDS = {
    "vocab_size": "vocab_size",
    "n_embd": "hidden_size",
    "n_layer": "num_layers",
    "n_head": "num_heads",
    "n_positions": "max_position_embeddings",
    "resid_pdrop": "dropout",
    "attn_pdrop": "attention_dropout",
    "layer_norm_epsilon": "layer_norm_eps",
    "initializer_range": "initializer_range",
    "tie_word_embeddings": "tie_word_embeddings",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}
# HF module (after "transformer.") -> sampan module inside GPTModel, for the unfused ones.
MODULES = {
    "wte": "embeddings.word_embeddings",
    "wpe": "embeddings.position_embeddings",
    "ln_f": "norm",
    "h.{i}.ln_1": "layers.{i}.norm1",
    "h.{i}.ln_2": "layers.{i}.norm2",
    "h.{i}.attn.c_proj": "layers.{i}.attn.out_proj",
    "h.{i}.mlp.c_fc": "layers.{i}.mlp.fc1",
    "h.{i}.mlp.c_proj": "layers.{i}.mlp.fc2",
}
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
QKV = ("q_proj", "k_proj", "v_proj")
# Buffers of GPT-2 checkpoints (the causal mask), not weights.
IGNORED = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")
_PATTERNS = [(re.compile(re.escape(hf).replace(re.escape("{i}"), r"(?P<i>\d+)")), ours) for hf, ours in MODULES.items()]


def config_from_hf(hf: Mapping[str, Any]) -> GPTConfig:
    """A ``GPTConfig`` from a GPT-2 ``config.json``; attention variants sampan lacks are errors."""
    if not hf.get("scale_attn_weights", True):
        raise ValueError("scale_attn_weights=false is not supported: sampan scales attention by 1/sqrt(head_dim)")
    if hf.get("scale_attn_by_inverse_layer_idx"):
        raise ValueError("scale_attn_by_inverse_layer_idx=true is not supported")
    if hf.get("add_cross_attention"):
        raise ValueError("add_cross_attention=true is not supported: sampan's GPT is a decoder-only model")
    fields: dict[str, Any] = {ours: hf[theirs] for theirs, ours in CONFIG_FIELDS.items() if hf.get(theirs) is not None}
    vocab = fields.get("vocab_size", GPTConfig.vocab_size)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        # transformers' GPT2Config defaults bos / eos to 50256 whatever the vocabulary (it only
        # warns); an id outside the vocabulary names no token, so it cannot end generation.
        if isinstance(fields.get(key), int) and not 0 <= fields[key] < vocab:
            warnings.warn(f"GPT-2 config {key}={fields[key]} is outside its vocabulary of {vocab}: ignored",
                          stacklevel=3)
            fields[key] = None
    fields["intermediate_size"] = hf.get("n_inner") or 0
    fields["activation"] = activation_from_hf(hf, "activation_function", "gelu_new")
    fields.setdefault("tie_word_embeddings", True)
    return GPTConfig(**fields)


def head_from_hf(hf: Mapping[str, Any], tensor_names: set[str]) -> str:
    """``GPT2LMHeadModel`` -> "causal_lm", ``GPT2Model`` -> "none"; else by the tensor names."""
    head = head_from_architectures(hf, HEAD_SUFFIXES)
    if head is None:
        head = "causal_lm" if any(n.startswith("transformer.") for n in tensor_names) else "none"
    return head


def tensor_from_hf(name: str, tensor: Any, config: GPTConfig, head: str) -> list[tuple[str, Any]]:
    """One GPT-2 tensor as sampan's: Conv1D weights transposed, ``c_attn`` split into q / k / v."""
    prefix = "" if head == "none" else "gpt."
    if name == "lm_head.weight":
        return [] if head == "none" else [("lm_head.weight", tensor)]
    name = name.removeprefix("transformer.")
    if IGNORED.fullmatch(name):
        return []
    module, _, param = name.rpartition(".")
    if module.endswith(CONV1D) and param == "weight":
        tensor = tensor.t()
    fused = re.fullmatch(r"h\.(\d+)\.attn\.c_attn", module)
    if fused:
        return [(f"{prefix}layers.{fused.group(1)}.attn.{proj}.{param}", part.contiguous())
                for proj, part in zip(QKV, tensor.chunk(3, dim=0), strict=True)]
    for pattern, ours in _PATTERNS:
        match = pattern.fullmatch(module)
        if match:
            return [(f"{prefix}{ours.format(**match.groupdict())}.{param}", tensor.contiguous())]
    raise KeyError(name)


def config_to_hf(config: GPTConfig, head: str) -> dict[str, Any]:
    """The ``config.json`` of ``GPT2LMHeadModel`` / ``GPT2Model``."""
    hf: dict[str, Any] = {theirs: getattr(config, ours) for theirs, ours in CONFIG_FIELDS.items()}
    hf.update({
        "model_type": "gpt2",
        "architectures": [HEAD_ARCHITECTURE[head]],
        "n_inner": config.intermediate_size,
        "embd_pdrop": config.dropout,
        "activation_function": ACTIVATIONS_TO_HF[config.activation],
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "use_cache": True,
    })
    return hf


def state_to_hf(state: Mapping[str, Any], config: GPTConfig, head: str) -> dict[str, Any]:
    """sampan's state dict under GPT-2's names: q / k / v fused into ``c_attn``, Conv1D weights transposed."""
    import torch  # here, not at the top: reading a config (sampan plan) must not import torch

    prefix = "" if head == "none" else "gpt."
    root = "" if head == "none" else "transformer."
    inverse = {ours: hf for hf, ours in MODULES.items()}
    out: dict[str, Any] = {}
    qkv: dict[tuple[str, str], dict[str, Any]] = {}
    for name, tensor in state.items():
        if name == "lm_head.weight":
            out[name] = tensor
            continue
        module, _, param = name.removeprefix(prefix).rpartition(".")
        attn = re.fullmatch(r"layers\.(\d+)\.attn\.(q_proj|k_proj|v_proj)", module)
        if attn:
            qkv.setdefault((attn.group(1), param), {})[attn.group(2)] = tensor
            continue
        layer = re.match(r"layers\.(\d+)\.", module)
        generic = f"layers.{{i}}.{module[layer.end():]}" if layer else module
        if generic not in inverse:
            raise ValueError(f"no GPT-2 name for sampan tensor {name}")
        hf_module = inverse[generic].format(i=layer.group(1) if layer else "")
        if hf_module.endswith(CONV1D) and param == "weight":
            tensor = tensor.t()
        out[f"{root}{hf_module}.{param}"] = tensor.contiguous()
    for (i, param), parts in qkv.items():
        fused = torch.cat([parts[p] for p in QKV], dim=0)
        out[f"{root}h.{i}.attn.c_attn.{param}"] = (fused.t() if param == "weight" else fused).contiguous()
    return out

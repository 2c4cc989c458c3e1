"""The Llama family's Hugging Face adapter: ``llama``, ``qwen2`` and ``qwen3`` checkpoints, both ways.

sampan's module names are HF's, so tensors map one to one; what differs is the config
(``num_hidden_layers`` vs ``num_layers``, rope settings in the old ``rope_theta`` / ``rope_scaling``
form or transformers 5's ``rope_parameters``) and which biases / norms each architecture has.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sampan.models.hf_names import ACTIVATIONS_TO_HF, activation_from_hf, head_from_architectures
from sampan.models.llama.config import LlamaConfig

CLASS_PREFIX = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}
HEAD_SUFFIXES = {"ForCausalLM": "causal_lm", "Model": "none"}
HEAD_ARCHITECTURE = {"causal_lm": "ForCausalLM", "none": "Model"}
# HF key -> LlamaConfig field, copied when present.
CONFIG_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps",
    "tie_word_embeddings": "tie_word_embeddings",
    "attention_dropout": "attention_dropout",
    "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}
# Tensors of old checkpoints that are buffers, not weights.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def _rope(hf: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either config layout."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict):  # transformers >= 5
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta, scaling = hf.get("rope_theta", 10000.0), hf.get("rope_scaling")
    if scaling and scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported: sampan rotates every dimension of a head")
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return float(theta), scaling


def config_from_hf(hf: Mapping[str, Any]) -> LlamaConfig:
    """A ``LlamaConfig`` from a Llama / Qwen2 / Qwen3 ``config.json``."""
    variant = hf["model_type"]
    if variant not in CLASS_PREFIX:
        raise ValueError(f"model_type {variant!r} is not a Llama-family model ({sorted(CLASS_PREFIX)})")
    if hf.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported: sampan's attention is full causal attention "
                         "on every layer (Qwen's published configs set it false)")
    fields: dict[str, Any] = {ours: hf[theirs] for theirs, ours in CONFIG_FIELDS.items() if hf.get(theirs) is not None}
    fields["rope_theta"], fields["rope_scaling"] = _rope(hf)
    fields["activation"] = activation_from_hf(hf, "hidden_act", "silu")
    fields["variant"] = variant
    if variant == "qwen2":  # Qwen2 hard-codes bias on q / k / v and none on the output projection
        fields["qkv_bias"], fields["out_bias"] = True, False
    else:
        fields["qkv_bias"] = fields["out_bias"] = bool(hf.get("attention_bias", False))
    fields["mlp_bias"] = bool(hf.get("mlp_bias", False)) if variant == "llama" else False
    fields["qk_norm"] = variant == "qwen3"
    fields.setdefault("tie_word_embeddings", False)
    return LlamaConfig(**fields)


def head_from_hf(hf: Mapping[str, Any], tensor_names: set[str]) -> str:
    """``ForCausalLM`` -> "causal_lm", ``Model`` -> "none"; without architectures, by the tensor names."""
    head = head_from_architectures(hf, HEAD_SUFFIXES)
    if head is None:
        head = "causal_lm" if any(n.startswith("model.") for n in tensor_names) else "none"
    return head


def tensor_from_hf(name: str, tensor: Any, config: LlamaConfig, head: str) -> list[tuple[str, Any]]:
    """HF names are sampan's; a causal-LM checkpoint loads as the bare model too (its head dropped)."""
    if name.endswith(IGNORED_SUFFIXES):
        return []
    in_lm = name.startswith("model.") or name == "lm_head.weight"
    if head == "none":
        if name == "lm_head.weight":
            return []
        return [(name.removeprefix("model.") if in_lm else name, tensor)]
    return [(name if in_lm else f"model.{name}", tensor)]


def _check_variant(config: LlamaConfig) -> None:
    variant, problems = config.variant, []
    if variant == "qwen2":
        if not config.qkv_bias or config.out_bias:
            problems.append("Qwen2 has bias on q / k / v and none on o_proj (qkv_bias=True, out_bias=False)")
        if config.qk_norm or config.mlp_bias:
            problems.append("Qwen2 has no qk_norm and no mlp_bias")
    else:
        if config.qkv_bias != config.out_bias:
            problems.append(f"{CLASS_PREFIX[variant]}'s attention_bias covers q, k, v and o together "
                            "(qkv_bias must equal out_bias)")
        if config.qk_norm != (variant == "qwen3"):
            problems.append("qk_norm=True is Qwen3's (variant='qwen3')" if config.qk_norm
                            else "Qwen3 always has qk_norm=True")
        if variant == "qwen3" and config.mlp_bias:
            problems.append("Qwen3 has no mlp_bias")
    if problems:
        raise ValueError(f"this config cannot be saved as a Hugging Face {variant!r} model: " + "; ".join(problems)
                         + "; set variant to the architecture these fields describe")


def config_to_hf(config: LlamaConfig, head: str) -> dict[str, Any]:
    """The ``config.json`` of the HF model of ``config.variant`` (LlamaForCausalLM, Qwen2Model, ...)."""
    _check_variant(config)
    hf: dict[str, Any] = {theirs: getattr(config, ours) for theirs, ours in CONFIG_FIELDS.items()}
    hf.update({
        "model_type": config.variant,
        "architectures": [CLASS_PREFIX[config.variant] + HEAD_ARCHITECTURE[head]],
        "hidden_act": ACTIVATIONS_TO_HF[config.activation],
        # The pre-transformers-5 layout: transformers 4 reads only this, 5 converts it on load.
        "rope_theta": config.rope_theta,
        "rope_scaling": dict(config.rope_scaling) if config.rope_scaling else None,
        "use_cache": True,
    })
    if config.variant != "qwen2":
        hf["attention_bias"] = config.qkv_bias
    if config.variant == "llama":
        hf["mlp_bias"] = config.mlp_bias
    else:
        hf["use_sliding_window"] = False
    return hf


def state_to_hf(state: Mapping[str, Any], config: LlamaConfig, head: str) -> dict[str, Any]:
    """sampan's state dict is already under HF's names."""
    return dict(state)


def tokenizer_problem(config: LlamaConfig, tokenizer_json: Mapping[str, Any]) -> str | None:
    """Why ``transformers`` would encode differently with this tokenizer in this model's directory
    (None when it would not). transformers 5 loads a ``qwen2`` directory's tokenizer as
    ``Qwen2Tokenizer`` whatever ``tokenizer_config.json`` names, rebuilding a byte-level BPE around
    the vocabulary; any other tokenizer gets other ids there."""
    if config.variant != "qwen2":
        return None
    model = tokenizer_json.get("model") or {}
    pre = json.dumps(tokenizer_json.get("pre_tokenizer"))
    if model.get("type") == "BPE" and "ByteLevel" in pre:
        return None
    return (f"transformers loads a Hugging Face qwen2 directory's tokenizer as Qwen2Tokenizer (a byte-level "
            f"BPE) whatever tokenizer_config.json says, so this {model.get('type', 'unknown')} tokenizer would "
            "encode other ids there; save the tokenizer in its own directory (tokenizer.save_pretrained(dir)), "
            "or train the model with a byte-level BPE tokenizer")

"""The ERNIE 4.5 family's Hugging Face adapter: ``ernie4_5`` (dense) and ``ernie4_5_moe`` checkpoints, both ways.

Attention, norms and dense MLPs carry HF's names. MoE layers differ in three ways:

* routed experts: hub checkpoints (and what transformers 5 writes) hold one tensor per expert
  (``mlp.experts.7.gate_proj.weight``); sampan stacks them (``mlp.experts.gate_up_proj [E, 2f, h]``,
  gate rows first, and ``mlp.experts.down_proj [E, h, f]``), the layout of transformers' in-memory
  model, whose fused names are read too. Per-expert tensors stream into their slice of the
  stacked one (``load_tensors``' ``(name, tensor, index)`` pieces); export writes per-expert names.
* the score-correction bias: stored as ``mlp.moe_statics.e_score_correction_bias [1, E]``
  (transformers' module path is ``mlp.gate.moe_statics...``); sampan's is the router's buffer
  ``mlp.gate.e_score_correction_bias [E]``.
* multi-token-prediction layers (``mtp_*`` tensors, ``num_nextn_predict_layers``) are dropped
  on load, as transformers drops them: neither model runs them in ``forward``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sampan.models.ernie4_5.config import Ernie4_5Config
from sampan.models.hf_names import ACTIVATIONS_TO_HF, activation_from_hf, head_from_architectures

DENSE, MOE = "ernie4_5", "ernie4_5_moe"
CLASS_PREFIX = {DENSE: "Ernie4_5", MOE: "Ernie4_5_Moe"}
HEAD_SUFFIXES = {"ForCausalLM": "causal_lm", "Model": "none"}
HEAD_ARCHITECTURE = {"causal_lm": "ForCausalLM", "none": "Model"}
# HF key -> Ernie4_5Config field, copied when present (both architectures).
CONFIG_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps",
    "use_bias": "use_bias",
    "tie_word_embeddings": "tie_word_embeddings",
    "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}
# MoE keys -> fields, with transformers' defaults for a key the file leaves out (Ernie4_5_MoeConfig).
MOE_FIELDS = {
    "moe_num_experts": ("moe_num_experts", 64),
    "moe_k": ("moe_k", 6),
    "moe_intermediate_size": ("moe_intermediate_size", 1536),
    "moe_num_shared_experts": ("moe_num_shared_experts", 2),
    "moe_layer_start_index": ("moe_layer_start_index", 1),
    "moe_layer_end_index": ("moe_layer_end_index", -1),
    "moe_layer_interval": ("moe_layer_interval", 1),
    "moe_norm_min": ("moe_norm_min", 1e-12),
    "router_aux_loss_coef": ("router_aux_loss_coef", 0.001),
}
# transformers' defaults for keys a config.json may leave out (they differ from a plain None).
HF_DEFAULTS = {"tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
# Ernie4_5_MoeConfig's shape defaults where they differ from Ernie4_5Config's (which are sampan's).
MOE_SHAPE_DEFAULTS = {"hidden_size": 2560, "intermediate_size": 12288, "num_layers": 28, "num_heads": 20,
                      "num_kv_heads": 4}
# transformers' attribute_map aliases of MoE keys.
MOE_ALIASES = {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"}
DEFAULT_THETA = 500000.0
DENSE_DEFAULT_HEAD_DIM = 128  # Ernie4_5Config's default when config.json has no head_dim

_EXPERT = re.compile(r"^(?P<layer>.*\.mlp\.experts)\.(?P<j>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_STATICS = re.compile(r"^(?P<mlp>.*\.mlp)\.(?:gate\.)?moe_statics\.e_score_correction_bias$")
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def _rope_theta(hf: Mapping[str, Any]) -> float:
    params = hf.get("rope_parameters")
    if isinstance(params, dict):  # transformers >= 5
        scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type")}
        rope_type = params.get("rope_type", "default")
        theta = params.get("rope_theta", hf.get("rope_theta", DEFAULT_THETA))
    else:
        scaling = dict(hf.get("rope_scaling") or {})
        rope_type = scaling.pop("rope_type", scaling.pop("type", "default"))
        theta = hf.get("rope_theta", DEFAULT_THETA)
    if rope_type != "default" or scaling.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"rope_parameters {dict(params or hf.get('rope_scaling') or {})} are not supported: "
                         "sampan's ERNIE 4.5 rotates every dimension with plain RoPE (rope_type 'default'), as every "
                         "published ERNIE 4.5 model does")
    return float(theta)


def config_from_hf(hf: Mapping[str, Any]) -> Ernie4_5Config:
    """An ``Ernie4_5Config`` from an ``ernie4_5`` or ``ernie4_5_moe`` ``config.json``."""
    model_type = hf["model_type"]
    if model_type not in CLASS_PREFIX:
        raise ValueError(f"model_type {model_type!r} is not an ERNIE 4.5 model ({sorted(CLASS_PREFIX)})")
    if hf.get("use_rmsnorm", True) is False:
        raise ValueError("use_rmsnorm=false is not supported: ERNIE 4.5's norms are RMSNorms in sampan and in "
                         "transformers (which ignores the key); every published ERNIE 4.5 model sets it true")
    hf = {**hf, **{ours: hf[alias] for alias, ours in MOE_ALIASES.items() if alias in hf and ours not in hf}}
    # An absent key takes transformers' default for the architecture (the 0.3B's or the 21B's
    # shape); a null one too, except the special ids (null: none) and num_key_value_heads (null:
    # num_attention_heads).
    fields: dict[str, Any] = {ours: hf[theirs] for theirs, ours in CONFIG_FIELDS.items() if hf.get(theirs) is not None}
    if "num_key_value_heads" in hf and hf["num_key_value_heads"] is None:
        fields["num_kv_heads"] = 0
    defaults = {**HF_DEFAULTS, **(MOE_SHAPE_DEFAULTS if model_type == MOE else {})}
    for key, value in defaults.items():
        fields.setdefault(key, None if key.endswith("_token_id") and key in hf else value)
    fields.setdefault("use_bias", False)
    fields["use_bias"] = bool(fields["use_bias"])
    if "head_dim" in hf:
        fields["head_dim"] = hf["head_dim"] or 0
    else:  # Ernie4_5Config defaults to 128; the MoE config has no such field and uses h / H
        fields["head_dim"] = DENSE_DEFAULT_HEAD_DIM if model_type == DENSE else 0
    fields["rope_theta"] = _rope_theta(hf)
    fields["activation"] = activation_from_hf(hf, "hidden_act", "silu")
    if model_type == MOE:
        gate_act = hf.get("moe_gate_act", "softmax")
        if gate_act != "softmax":
            raise ValueError(f"moe_gate_act {gate_act!r} is not supported: transformers' and sampan's ERNIE 4.5 "
                             "router scores experts with a softmax")
        for theirs, (ours, default) in MOE_FIELDS.items():
            value = hf.get(theirs)
            fields[ours] = default if value is None else value
        # transformers adds its Switch-style balancing loss when output_router_logits is set.
        fields["moe_aux_loss"] = "micro_batch" if hf.get("output_router_logits") else "none"
    return Ernie4_5Config(**fields)


def head_from_hf(hf: Mapping[str, Any], tensor_names: set[str]) -> str:
    """``ForCausalLM`` -> "causal_lm", ``Model`` -> "none"; without architectures, by the tensor names."""
    head = head_from_architectures(hf, HEAD_SUFFIXES)
    if head is None:
        head = "causal_lm" if any(n.startswith("model.") for n in tensor_names) else "none"
    return head


def _sampan_name(name: str, head: str) -> str | None:
    """HF's module path as sampan's for ``head`` (None for the LM head on the bare model)."""
    in_lm = name.startswith("model.") or name == "lm_head.weight"
    if head == "none":
        return None if name == "lm_head.weight" else (name.removeprefix("model.") if in_lm else name)
    return name if in_lm else f"model.{name}"


def tensor_from_hf(name: str, tensor: Any, config: Ernie4_5Config, head: str) -> list[tuple]:
    """One HF tensor as sampan ``(name, tensor)`` pairs, or ``(name, tensor, index)`` pieces for one
    expert's slice of the stacked expert tensors."""
    if name.endswith(IGNORED_SUFFIXES) or name.startswith("mtp"):
        return []
    expert = _EXPERT.match(name)
    if expert is not None:
        target = _sampan_name(expert["layer"], head)
        j, f = int(expert["j"]), config.moe_intermediate_size
        if expert["proj"] == "down_proj":
            return [(f"{target}.down_proj", tensor, j)]
        rows = slice(0, f) if expert["proj"] == "gate_proj" else slice(f, 2 * f)
        return [(f"{target}.gate_up_proj", tensor, (j, rows))]
    statics = _STATICS.match(name)
    if statics is not None:
        return [(f"{_sampan_name(statics['mlp'], head)}.gate.e_score_correction_bias", tensor.reshape(-1))]
    target = _sampan_name(name, head)
    return [] if target is None else [(target, tensor)]


def _model_type(config: Ernie4_5Config) -> str:
    return MOE if config.is_moe else DENSE


def config_to_hf(config: Ernie4_5Config, head: str) -> dict[str, Any]:
    """The ``config.json`` of ``Ernie4_5ForCausalLM`` (dense) or ``Ernie4_5_MoeForCausalLM`` (MoE)."""
    model_type = _model_type(config)
    if config.moe_capacity_factor is not None:
        raise ValueError(f"moe_capacity_factor={config.moe_capacity_factor} cannot be saved as a Hugging Face "
                         "ernie4_5_moe model: transformers routes without dropping tokens; set "
                         "moe_capacity_factor=None (dropless) to export")
    hf: dict[str, Any] = {theirs: getattr(config, ours) for theirs, ours in CONFIG_FIELDS.items()}
    hf.update({
        "model_type": model_type,
        "architectures": [CLASS_PREFIX[model_type] + HEAD_ARCHITECTURE[head]],
        "head_dim": config.head_dim,
        "hidden_act": ACTIVATIONS_TO_HF[config.activation],
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_theta": config.rope_theta,  # the pre-transformers-5 layout, for older readers
        "use_cache": True,
    })
    if model_type == MOE:
        hf.update({theirs: getattr(config, ours) for theirs, (ours, _) in MOE_FIELDS.items()})
        # sampan runs no multi-token-prediction layer, so the export holds none.
        hf["num_nextn_predict_layers"] = None
        hf["output_router_logits"] = config.moe_aux_loss != "none"
    return hf


def state_to_hf(state: Mapping[str, Any], config: Ernie4_5Config, head: str) -> dict[str, Any]:
    """sampan's state dict under HF's names, experts one by one as hub checkpoints store them."""
    out: dict[str, Any] = {}
    f = config.moe_intermediate_size
    for name, tensor in state.items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix = name.removesuffix(".gate_up_proj")
            for j in range(tensor.shape[0]):  # clones: safetensors refuses views of one storage
                out[f"{prefix}.{j}.gate_proj.weight"] = tensor[j, :f].clone()
                out[f"{prefix}.{j}.up_proj.weight"] = tensor[j, f:].clone()
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name.removesuffix(".down_proj")
            for j in range(tensor.shape[0]):
                out[f"{prefix}.{j}.down_proj.weight"] = tensor[j].clone()
        elif name.endswith(".mlp.gate.e_score_correction_bias"):
            out[name.replace(".gate.e_score_correction_bias", ".moe_statics.e_score_correction_bias")] = \
                tensor.reshape(1, -1)
        else:
            out[name] = tensor
    return out

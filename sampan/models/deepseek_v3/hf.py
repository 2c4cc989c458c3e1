"""The DeepSeek-V3 family's Hugging Face adapter: ``deepseek_v3`` checkpoints, both ways.

Names are HF's except for two things. Experts: the Hub stores them one by one
(``mlp.experts.J.gate_proj.weight`` ...), transformers 5 may save them fused
(``mlp.experts.gate_up_proj``); sampan keeps them stacked (``experts.gate_up_proj [E, 2f, h]``,
gate rows first, ``experts.down_proj [E, h, f]``), reads both and writes them one by one as the
Hub does. MTP: the Hub stores module ``K`` as ``model.layers.{num_hidden_layers + K}.*`` (with
copies of the embedding and the head); sampan holds it as ``mtp.K`` and shares the embedding and
head. Loading skips the MTP tensors unless asked (``"sampan_load_mtp": true`` beside the HF keys,
or :func:`sampan.models.deepseek_v3.modeling.from_pretrained_with_mtp`), so by default the model
is what transformers builds and its logits are transformers'.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sampan.models.deepseek_v3.config import DeepseekV3Config
from sampan.models.hf_names import ACTIVATIONS_TO_HF, activation_from_hf, head_from_architectures

HEAD_SUFFIXES = {"ForCausalLM": "causal_lm", "Model": "none"}
HEAD_ARCHITECTURE = {"causal_lm": "DeepseekV3ForCausalLM", "none": "DeepseekV3Model"}
LOAD_MTP_KEY = "sampan_load_mtp"
# HF key -> DeepseekV3Config field, copied when present.
CONFIG_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "intermediate_size": "intermediate_size",
    "moe_intermediate_size": "moe_intermediate_size",
    "n_routed_experts": "n_routed_experts",
    "n_shared_experts": "n_shared_experts",
    "num_experts_per_tok": "num_experts_per_tok",
    "n_group": "n_group",
    "topk_group": "topk_group",
    "routed_scaling_factor": "routed_scaling_factor",
    "norm_topk_prob": "norm_topk_prob",
    "first_k_dense_replace": "first_k_dense_replace",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "max_position_embeddings": "max_position_embeddings",
    "rms_norm_eps": "rms_norm_eps",
    "rope_interleave": "rope_interleave",
    "attention_bias": "attention_bias",
    "attention_dropout": "attention_dropout",
    "tie_word_embeddings": "tie_word_embeddings",
    "initializer_range": "initializer_range",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "pad_token_id": "pad_token_id",
}
# Tensors of old checkpoints that are buffers, not weights.
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.*)$")
# What an MTP module holds on the Hub that sampan shares with the main model.
MTP_SHARED = ("embed_tokens.weight", "shared_head.head.weight")


def _rope(hf: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either config layout (transformers 5's ``rope_parameters``)."""
    params = hf.get("rope_parameters")
    if isinstance(params, dict):
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta, scaling = hf.get("rope_theta", 10000.0), hf.get("rope_scaling")
    if scaling:
        scaling = dict(scaling)
        if scaling.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError("partial_rotary_factor != 1 is not supported: MLA rotates all qk_rope_head_dim dimensions")
        scaling.pop("partial_rotary_factor", None)
        scaling.setdefault("rope_type", scaling.pop("type", "default"))
        scaling.pop("type", None)
        if scaling["rope_type"] == "default":
            return float(theta), None
        if scaling.get("attention_factor") is not None:
            raise ValueError("rope attention_factor is not supported: DeepSeek's YaRN derives it from mscale / "
                             "mscale_all_dim; remove attention_factor")
        if scaling.get("truncate", True) is not True:
            raise ValueError("rope truncate=false is not supported (DeepSeek's YaRN truncates the ramp)")
        scaling.pop("attention_factor", None)
        scaling.pop("truncate", None)
        if scaling["rope_type"] == "yarn":  # transformers' default, as it fills it in
            scaling.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    return float(theta), scaling or None


def config_from_hf(hf: Mapping[str, Any]) -> DeepseekV3Config:
    """A ``DeepseekV3Config`` from a DeepSeek-V3 ``config.json`` (the Hub's or transformers')."""
    if hf.get("model_type") != "deepseek_v3":
        raise ValueError(f"model_type {hf.get('model_type')!r} is not 'deepseek_v3'")
    if hf.get("quantization_config"):
        method = hf["quantization_config"].get("quant_method", "?")
        raise ValueError(f"quantization_config ({method}) is not supported: the Hub's DeepSeek-V3 weights are FP8 "
                         "blocks with weight_scale_inv tensors; dequantize them to bf16 first (DeepSeek's "
                         "inference/fp8_cast_bf16.py) and drop quantization_config")
    refused = {
        "moe_layer_freq": (1, "every layer after first_k_dense_replace must be MoE (moe_layer_freq=1)"),
        "scoring_func": ("sigmoid", "DeepSeek-V3 routes by sigmoid scores (scoring_func='sigmoid')"),
        "topk_method": ("noaux_tc", "only DeepSeek-V3's group-limited, bias-corrected top-k (noaux_tc)"),
        "pretraining_tp": (1, "pretraining_tp slices matmuls (pretraining_tp=1)"),
    }
    for key, (allowed, why) in refused.items():
        if hf.get(key) is not None and hf[key] != allowed:
            raise ValueError(f"{key}={hf[key]!r} is not supported: {why}")
    heads = hf.get("num_attention_heads")
    if hf.get("num_key_value_heads") not in (None, heads):
        raise ValueError(f"num_key_value_heads={hf['num_key_value_heads']} != num_attention_heads={heads} is not "
                         "supported: MLA expands its latent into keys and values for every head")
    fields: dict[str, Any] = {ours: hf[theirs] for theirs, ours in CONFIG_FIELDS.items() if hf.get(theirs) is not None}
    if "q_lora_rank" in hf and hf["q_lora_rank"] is None:
        fields["q_lora_rank"] = None
    fields["rope_theta"], fields["rope_scaling"] = _rope(hf)
    fields["activation"] = activation_from_hf(hf, "hidden_act", "silu")
    fields.setdefault("tie_word_embeddings", False)
    if hf.get("seq_aux") is not None:
        fields["aux_loss"] = "sequence" if hf["seq_aux"] else "micro_batch"
    if hf.get("aux_loss_alpha") is not None:
        fields["aux_loss_coef"] = float(hf["aux_loss_alpha"])
    mtp = hf.get("num_nextn_predict_layers", hf.get("num_mtp_layers", 0)) or 0
    fields["num_nextn_predict_layers"] = mtp if hf.get(LOAD_MTP_KEY) else 0
    return DeepseekV3Config(**fields)


def head_from_hf(hf: Mapping[str, Any], tensor_names: set[str]) -> str:
    """``DeepseekV3ForCausalLM`` -> "causal_lm", ``DeepseekV3Model`` -> "none"."""
    head = head_from_architectures(hf, HEAD_SUFFIXES)
    if head is None:
        head = "causal_lm" if any(n.startswith("model.") for n in tensor_names) else "none"
    return head


def _experts_from_hf(name: str, tensor: Any, config: DeepseekV3Config) -> list[tuple]:
    """One expert's weight as a piece of the stacked tensor; fused ones pass through."""
    match = _EXPERT.match(name)
    if match is None:
        return [(name, tensor)]
    prefix, j, proj = match.group(1), int(match.group(2)), match.group(3)
    f = config.moe_intermediate_size
    if proj == "down_proj":
        return [(f"{prefix}.down_proj", tensor, j)]
    rows = slice(0, f) if proj == "gate_proj" else slice(f, 2 * f)
    return [(f"{prefix}.gate_up_proj", tensor, (j, rows))]


def tensor_from_hf(name: str, tensor: Any, config: DeepseekV3Config, head: str) -> list[tuple]:
    """HF names to sampan's: experts stacked, ``model.layers.{L + K}`` to ``mtp.K`` (or skipped
    when the config has no MTP modules), its embedding / head copies dropped."""
    if name.endswith(IGNORED_SUFFIXES):
        return []
    layer = _LAYER.match(name)
    if layer is not None and int(layer.group(1)) >= config.num_layers:
        k, rest = int(layer.group(1)) - config.num_layers, layer.group(2)
        if head == "none" or k >= config.num_nextn_predict_layers:
            return []  # an MTP module this model does not build (transformers ignores them too)
        if rest in MTP_SHARED:
            return []  # sampan's MTP shares the main embedding and head
        return _experts_from_hf(f"mtp.{k}.{rest}", tensor, config)
    in_lm = name.startswith("model.") or name == "lm_head.weight"
    if head == "none":
        if name == "lm_head.weight":
            return []
        name = name.removeprefix("model.") if in_lm else name
    else:
        name = name if in_lm else f"model.{name}"
    return _experts_from_hf(name, tensor, config)


def config_to_hf(config: DeepseekV3Config, head: str) -> dict[str, Any]:
    """The ``config.json`` transformers' ``DeepseekV3ForCausalLM`` / ``DeepseekV3Model`` reads (with the
    Hub's routing keys, so DeepSeek's own code reads it too)."""
    hf: dict[str, Any] = {theirs: getattr(config, ours) for theirs, ours in CONFIG_FIELDS.items()}
    hf.update({
        "model_type": "deepseek_v3",
        "architectures": [HEAD_ARCHITECTURE[head]],
        "hidden_act": ACTIVATIONS_TO_HF[config.activation],
        "num_key_value_heads": config.num_heads,
        "rope_theta": config.rope_theta,
        "rope_scaling": dict(config.rope_scaling) if config.rope_scaling else None,
        # The bare decoder holds no MTP modules, so its directory has none to announce.
        "num_nextn_predict_layers": config.num_nextn_predict_layers if head == "causal_lm" else 0,
        "moe_layer_freq": 1,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "seq_aux": config.aux_loss == "sequence",
        "aux_loss_alpha": config.aux_loss_coef,
        "use_cache": True,
    })
    return hf


def _experts_to_hf(name: str, tensor: Any, config: DeepseekV3Config, out: dict[str, Any]) -> bool:
    prefix, _, leaf = name.rpartition(".")
    if not prefix.endswith(".mlp.experts") or leaf not in ("gate_up_proj", "down_proj"):
        return False
    f = config.moe_intermediate_size
    for j in range(tensor.shape[0]):
        if leaf == "down_proj":
            out[f"{prefix}.{j}.down_proj.weight"] = tensor[j].contiguous()
        else:
            out[f"{prefix}.{j}.gate_proj.weight"] = tensor[j, :f].contiguous()
            out[f"{prefix}.{j}.up_proj.weight"] = tensor[j, f:].contiguous()
    return True


def state_to_hf(state: Mapping[str, Any], config: DeepseekV3Config, head: str) -> dict[str, Any]:
    """Experts one by one; ``mtp.K.*`` as ``model.layers.{num_layers + K}.*`` with the copies of the
    embedding and head the Hub layout carries."""
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        if name.startswith("mtp."):
            k, _, rest = name.removeprefix("mtp.").partition(".")
            name = f"model.layers.{config.num_layers + int(k)}.{rest}"
        if not _experts_to_hf(name, tensor, config, out):
            out[name] = tensor
    if head == "causal_lm":
        embed = state["model.embed_tokens.weight"]
        lm_head = state.get("lm_head.weight", embed)  # tied: the head is the embedding
        for k in range(config.num_nextn_predict_layers):
            out[f"model.layers.{config.num_layers + k}.embed_tokens.weight"] = embed.clone()
            out[f"model.layers.{config.num_layers + k}.shared_head.head.weight"] = lm_head.clone()
    return out

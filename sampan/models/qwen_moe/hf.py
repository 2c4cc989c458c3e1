"""The Qwen-MoE family's Hugging Face adapter: ``qwen2_moe`` and ``qwen3_moe`` checkpoints, both ways.

Attention, norms and embeddings carry HF's names already, and their config is read by the
Llama family's adapter (a ``qwen2_moe`` config is a ``qwen2`` one plus MoE keys, ``qwen3_moe`` a
``qwen3`` one). What is mapped here:

* experts: hub checkpoints (and transformers' ``save_pretrained``) store them one by one,
  ``mlp.experts.{j}.gate_proj / up_proj / down_proj.weight``; sampan stacks them as the MoE
  block's ``experts.gate_up_proj [E, 2f, h]`` (gate rows, then up rows) and ``experts.down_proj
  [E, h, f]``. Each expert's tensor fills its slice as the checkpoint streams; the fused names
  (transformers' in-memory layout) are read too. Export writes one tensor per expert.
* Qwen2-MoE's ``shared_expert`` is the MoE block's ``shared_experts``; ``shared_expert_gate`` and
  the router ``gate`` keep their names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sampan.models.hf_names import ACTIVATIONS_TO_HF
from sampan.models.llama import hf as llama_hf
from sampan.models.qwen_moe.config import LLAMA_VARIANT, VARIANTS, QwenMoeConfig

CLASS_PREFIX = {"qwen2_moe": "Qwen2Moe", "qwen3_moe": "Qwen3Moe"}
HEAD_ARCHITECTURE = {"causal_lm": "ForCausalLM", "none": "Model"}
# HF key -> QwenMoeConfig field, with transformers' default when the key is absent (they differ
# by variant: a config.json that leaves one out means what transformers would build).
MOE_FIELDS = {
    "moe_intermediate_size": "moe_intermediate_size",
    "num_experts_per_tok": "num_experts_per_tok",
    "norm_topk_prob": "norm_topk_prob",
    "decoder_sparse_step": "decoder_sparse_step",
    "mlp_only_layers": "mlp_only_layers",
    "router_aux_loss_coef": "router_aux_loss_coef",
}
HF_DEFAULTS = {
    "qwen2_moe": {"moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
                  "num_experts_per_tok": 4, "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "router_aux_loss_coef": 0.001},
    "qwen3_moe": {"moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                  "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "router_aux_loss_coef": 0.001},
}
# Llama-family fields a QwenMoeConfig takes from the LlamaConfig the Llama adapter reads.
ATTENTION_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling",
                    "qkv_bias", "out_bias", "qk_norm", "tie_word_embeddings", "attention_dropout", "activation",
                    "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id")

_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<index>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"^.*\.mlp\.experts\.(gate_up_proj|down_proj)$")


def _get(hf: Mapping[str, Any], key: str, variant: str) -> Any:
    value = hf.get(key)
    return HF_DEFAULTS[variant][key] if value is None else value


def config_from_hf(hf: Mapping[str, Any]) -> QwenMoeConfig:
    """A ``QwenMoeConfig`` from a ``qwen2_moe`` / ``qwen3_moe`` ``config.json``; a setting sampan
    cannot run (sliding-window attention, a zero-width Qwen2-MoE shared expert, ...) is refused
    by name."""
    variant = hf.get("model_type")
    if variant not in VARIANTS:
        raise ValueError(f"model_type {variant!r} is not a Qwen-MoE model ({list(VARIANTS)})")
    try:
        llama = llama_hf.config_from_hf({**hf, "model_type": LLAMA_VARIANT[variant]})
    except ValueError as err:  # the attention settings' checks, named for this family's config
        raise ValueError(str(err).replace("LlamaConfig.", "QwenMoeConfig.")) from None
    fields: dict[str, Any] = {name: getattr(llama, name) for name in ATTENTION_FIELDS}
    fields["variant"] = variant
    fields.update({ours: _get(hf, theirs, variant) for theirs, ours in MOE_FIELDS.items()})
    # transformers 5 writes Qwen3-MoE's expert count as num_local_experts (its attribute_map).
    experts = hf.get("num_experts", hf.get("num_local_experts"))
    fields["num_experts"] = HF_DEFAULTS[variant]["num_experts"] if experts is None else experts
    if variant == "qwen2_moe":
        # transformers 5's Qwen2-MoE has a qkv_bias switch (true in every published model).
        fields["qkv_bias"] = bool(hf.get("qkv_bias", True))
        shared = _get(hf, "shared_expert_intermediate_size", variant)
        if shared == 0:
            raise ValueError("shared_expert_intermediate_size=0 is not supported for qwen2_moe: transformers still "
                             "builds a zero-width shared expert and its gate; drop the shared expert by converting "
                             "the checkpoint to qwen3_moe's layout")
        fields["shared_expert_intermediate_size"] = shared
    if fields["num_experts"] == 0:
        raise ValueError("num_experts=0 makes every layer dense: load it as a dense Qwen model (model_type "
                         f"{LLAMA_VARIANT[variant]!r}, the llama family)")
    try:
        return QwenMoeConfig(**fields)
    except TypeError as err:  # a list where a number belongs, and the like
        raise ValueError(f"{variant} config: {err}") from None


def head_from_hf(hf: Mapping[str, Any], tensor_names: set[str]) -> str:
    """``...ForCausalLM`` -> "causal_lm", ``...Model`` -> "none" (as the Llama family reads it)."""
    return llama_hf.head_from_hf(hf, tensor_names)


def tensor_from_hf(name: str, tensor: Any, config: QwenMoeConfig, head: str) -> list[tuple]:
    """One HF tensor as sampan ``(name, tensor)`` or ``(name, tensor, index)`` items: a per-expert
    weight fills its expert's slice of the stacked tensor; everything else keeps its name (the
    shared expert renamed), under ``model.`` for the causal LM and without it for the bare body."""
    if name.endswith(llama_hf.IGNORED_SUFFIXES):
        return []
    items: list[tuple] = []
    expert = _EXPERT.match(name)
    if expert:
        j, f = int(expert["index"]), config.moe_intermediate_size
        if j >= config.num_experts:
            raise KeyError(name)
        proj = expert["proj"]
        if proj == "down_proj":
            items.append((f"{expert['prefix']}.down_proj", tensor, j))
        else:
            rows = slice(0, f) if proj == "gate_proj" else slice(f, 2 * f)
            items.append((f"{expert['prefix']}.gate_up_proj", tensor, (j, rows)))
    else:
        items.append((name.replace(".mlp.shared_expert.", ".mlp.shared_experts."), tensor))
    out = []
    for item in items:
        sampan_name, rest = item[0], item[1:]
        in_lm = sampan_name.startswith("model.") or sampan_name == "lm_head.weight"
        if head == "none":
            if sampan_name == "lm_head.weight":
                continue
            sampan_name = sampan_name.removeprefix("model.") if in_lm else sampan_name
        elif not in_lm:
            sampan_name = f"model.{sampan_name}"
        out.append((sampan_name, *rest))
    return out


def _check_variant(config: QwenMoeConfig) -> None:
    variant, problems = config.variant, []
    if variant == "qwen2_moe":
        if config.out_bias or config.qk_norm:
            problems.append("Qwen2-MoE has no bias on o_proj and no qk_norm (out_bias=False, qk_norm=False)")
        if config.shared_expert_intermediate_size == 0:
            problems.append("Qwen2-MoE always has a shared expert (shared_expert_intermediate_size > 0)")
    else:
        if config.qkv_bias != config.out_bias:
            problems.append("Qwen3-MoE's attention_bias covers q, k, v and o together (qkv_bias must equal out_bias)")
        if not config.qk_norm:
            problems.append("Qwen3-MoE always has qk_norm=True")
        if config.shared_expert_intermediate_size:
            problems.append("Qwen3-MoE has no shared expert (shared_expert_intermediate_size=0)")
    if problems:
        raise ValueError(f"this config cannot be saved as a Hugging Face {variant!r} model: " + "; ".join(problems)
                         + "; set variant to the architecture these fields describe")


def config_to_hf(config: QwenMoeConfig, head: str) -> dict[str, Any]:
    """The ``config.json`` of ``Qwen2MoeForCausalLM`` / ``Qwen3MoeForCausalLM`` (or ``...Model``)."""
    _check_variant(config)
    hf: dict[str, Any] = {theirs: getattr(config, ours) for theirs, ours in llama_hf.CONFIG_FIELDS.items()}
    hf.update({theirs: getattr(config, ours) for theirs, ours in MOE_FIELDS.items()})
    hf.update({
        "model_type": config.variant,
        "architectures": [CLASS_PREFIX[config.variant] + HEAD_ARCHITECTURE[head]],
        "num_experts": config.num_experts,
        "mlp_only_layers": list(config.mlp_only_layers),
        "hidden_act": ACTIVATIONS_TO_HF[config.activation],
        # The pre-transformers-5 layout: transformers 4 reads only this, 5 converts it on load.
        "rope_theta": config.rope_theta,
        "rope_scaling": dict(config.rope_scaling) if config.rope_scaling else None,
        "use_sliding_window": False,
        "use_cache": True,
    })
    if config.variant == "qwen2_moe":
        hf["shared_expert_intermediate_size"] = config.shared_expert_intermediate_size
        hf["qkv_bias"] = config.qkv_bias  # read by transformers >= 5; 4 always has the bias
    else:
        hf["attention_bias"] = config.qkv_bias
    return hf


def state_to_hf(state: Mapping[str, Any], config: QwenMoeConfig, head: str) -> dict[str, Any]:
    """sampan's state dict under HF's names: stacked experts split into one tensor per expert
    (copies: safetensors refuses tensors that share storage), the shared expert renamed."""
    out: dict[str, Any] = {}
    f = config.moe_intermediate_size
    for name, tensor in state.items():
        fused = _FUSED.match(name)
        if fused:
            prefix = name.rpartition(".")[0]
            for j in range(tensor.shape[0]):
                if fused.group(1) == "gate_up_proj":
                    out[f"{prefix}.{j}.gate_proj.weight"] = tensor[j, :f].clone()
                    out[f"{prefix}.{j}.up_proj.weight"] = tensor[j, f:].clone()
                else:
                    out[f"{prefix}.{j}.down_proj.weight"] = tensor[j].clone()
        else:
            out[name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")] = tensor
    return out


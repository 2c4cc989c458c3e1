"""LoRA adapters in peft's format: ``adapter_config.json`` + ``adapter_model.safetensors``.

A model fine-tuned with :func:`sampan.finetune.apply_lora` saves its low-rank updates where
``peft.PeftModel.from_pretrained(base, adapter_dir)`` loads them onto the base exported with
``save_pretrained(format="hf")``, so the fine-tune runs in ``transformers`` + ``peft`` (or any
server that reads peft adapters) with the logits sampan computes. peft itself is not needed to
write the files (it is a test-only reference).

LoRA on an MoE model's routed experts (``LoRAExperts``) is written as peft 0.21 writes
``LoraConfig(target_parameters=[...])`` on transformers 5's fused experts: the parameters in
``target_parameters`` and, because peft nests one ``ParamWrapper`` per targeted parameter
(``gate_up_proj`` innermost), ``...experts.base_layer.lora_A.weight`` for ``gate_up_proj`` and
``...experts.lora_A.weight`` for ``down_proj`` when both are adapted.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import nn

from sampan.finetune.lora import LoRAExperts, LoRALinear, _set_submodule
from sampan.utils.atomic import atomic_dir

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Hugging Face model types whose transformers-5 MoE layout peft 0.21 converts an adapter config
# for (peft/utils/transformers_weight_conversion.py, _convert_peft_config_moe): every target_modules
# entry ending in ".gate_proj", ".up_proj", ".down_proj" or ".gate" is taken for the v4 per-expert
# Linear it once was and moved to the fused experts' target_parameters (gate_up_proj at twice the
# rank). LoRA on a dense MLP's or a shared expert's projections by those names would load onto the
# routed experts instead, so it is refused for these types (qwen2_moe is not converted).
PEFT_CONVERTED_MOE_TYPES = ("qwen3_moe", "ernie4_5_moe", "deepseek_v3")
PEFT_CONVERTED_LEAVES = ("gate_proj", "up_proj", "down_proj", "gate")
# sampan head -> peft task_type (what PeftModel wraps the base in).
TASK_TYPES = {"causal_lm": "CAUSAL_LM", "sequence_classification": "SEQ_CLS", "token_classification": "TOKEN_CLS"}


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The model's LoRA linear layers by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def lora_experts(model: nn.Module) -> dict[str, LoRAExperts]:
    """The model's LoRA routed-expert layers by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRAExperts)}


def _expert_keys(layer: LoRAExperts, hf_module: str) -> dict[str, str]:
    """Adapted parameter -> its tensors' key prefix in a peft file: peft wraps the module once per
    parameter, the first (``gate_up_proj``) innermost, each wrapper one ``base_layer.`` deeper."""
    params = layer.adapted_params
    return {param: f"base_model.model.{hf_module}." + "base_layer." * (len(params) - 1 - i)
            for i, param in enumerate(params)}


def _base_linear(layer: LoRALinear) -> nn.Linear:
    plain = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
    plain.weight, plain.bias = layer.weight, layer.bias  # shared, not copied
    return plain


@contextlib.contextmanager
def without_lora(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` with each LoRA layer swapped for its frozen base layer (the update dropped, not
    merged) while the block runs, then swapped back: the base the adapter was trained on, for
    ``save_pretrained(format="hf")``, without copying any weight."""
    layers = lora_layers(model)
    experts = lora_experts(model)
    try:
        for name, layer in layers.items():
            _set_submodule(model, name, _base_linear(layer))
        for name, layer in experts.items():
            _set_submodule(model, name, layer.unadapted())
        yield model
    finally:
        for name, layer in {**layers, **experts}.items():
            _set_submodule(model, name, layer)


def _to_hf(adapter, state: dict, model: nn.Module, head: str) -> dict:
    """``adapter.state_to_hf`` on a few tensors. An adapter that reads a tensor beside the ones
    given (DeepSeek-V3's copies the embedding for its MTP layers) gets it from the model, and
    what that tensor alone maps to is left out of the answer."""
    extra: dict = {}
    full = None
    for _ in range(4):
        try:
            out = adapter.state_to_hf({**state, **extra}, model.config, head)
        except KeyError as err:
            full = model.state_dict() if full is None else full
            missing = err.args[0] if err.args else None
            if missing not in full or missing in extra or missing in state:
                raise
            extra[missing] = full[missing].detach()
            continue
        if extra:
            for key in adapter.state_to_hf(extra, model.config, head):
                out.pop(key, None)
        return out
    raise KeyError(f"the family's state_to_hf wants more tensors than {sorted(extra)}")


def _hf_module_names(model: nn.Module, names: list[str]) -> dict[str, str]:
    """sampan module name -> the module's name in the Hugging Face export (via the family adapter)."""
    from sampan.models.registry import spec_of

    spec = spec_of(model)
    if spec is None:
        raise ValueError(f"{type(model).__name__} is not a sampan model family: peft adapters are written for "
                         "models that also export to Hugging Face format")
    adapter, head = spec.hf_adapter(), type(model).head
    mapped = {}
    for name in names:
        module = model.get_submodule(name)
        if isinstance(module, LoRAExperts):
            mapped[name] = _hf_experts_name(adapter, model, name, module, head)
            continue
        weight = module.weight.detach()
        try:
            hf = _to_hf(adapter, {f"{name}.weight": weight}, model, head)
        except (KeyError, ValueError):  # a module HF fuses with others has no name of its own
            hf = {}
        keys = [k for k, v in hf.items() if k.endswith(".weight") and v.shape == weight.shape]
        if len(hf) != 1 or not keys:
            raise ValueError(f"LoRA on {name} has no one-to-one Hugging Face module in the {spec.family} family's "
                             "export (GPT-2 fuses q / k / v into one c_attn); merge the update into the weights "
                             "(merge_lora) and save the whole model with save_pretrained(format='hf') instead")
        mapped[name] = keys[0].removesuffix(".weight")
    return mapped


def _hf_experts_name(adapter, model: nn.Module, name: str, layer: LoRAExperts, head: str) -> str:
    """The routed experts' module name in transformers 5 (whose fused in-memory layout is sampan's):
    where the family's export puts them, per expert (``...experts.3.gate_proj.weight``) or fused."""
    weight = layer._parameters["gate_up_proj"].detach()
    try:
        hf = _to_hf(adapter, {f"{name}.gate_up_proj": weight}, model, head)
    except (KeyError, ValueError):
        hf = {}
    modules = {key.rpartition(".experts.")[0] + ".experts" for key in hf if ".experts." in key}
    if len(modules) != 1:
        raise ValueError(f"LoRA on {name}: the {type(model).__name__} export maps its experts to {sorted(hf)[:4]}, "
                         "not one Hugging Face experts module; merge the update (merge_lora) and save the whole model")
    return modules.pop()


def _check_peft_reads_back(model: nn.Module, hf_names: dict[str, str], head: str) -> None:
    """Refuse Linear targets peft would move onto the routed experts (see PEFT_CONVERTED_MOE_TYPES)."""
    from sampan.models.registry import spec_of

    clashing = sorted(hf for hf in hf_names.values() if hf.rpartition(".")[2] in PEFT_CONVERTED_LEAVES)
    if not clashing:
        return
    model_type = spec_of(model).hf_adapter().config_to_hf(model.config, head).get("model_type")
    if model_type in PEFT_CONVERTED_MOE_TYPES:
        raise ValueError(f"LoRA on {clashing[:3]}{' ...' if len(clashing) > 3 else ''} cannot be written as a peft "
                         f"adapter for a {model_type} model: peft 0.21 reads target modules named gate_proj / "
                         "up_proj / down_proj on transformers 5 MoE models as the routed experts. Adapt the experts "
                         "('experts') and attention only, or merge the update (merge_lora) and save the whole model")


def save_peft_adapter(model: nn.Module, adapter_dir: str | os.PathLike, base_dir: str | os.PathLike | None = None,
                      base_model_name_or_path: str | None = None) -> Path:
    """Write ``model``'s LoRA layers as a peft adapter in ``adapter_dir`` (atomically); returns its path.

    ``base_dir``, when given, also receives the base model (the weights the adapter was trained
    on, without the update) in Hugging Face format, and the adapter names it as its base. Every
    LoRA layer must share one rank and alpha (peft's ``r`` / ``lora_alpha``; sampan's
    ``apply_lora`` makes them so).
    """
    layers = lora_layers(model)
    experts = lora_experts(model)
    if not layers and not experts:
        raise ValueError("the model has no LoRA layers: apply sampan.finetune.apply_lora(model, targets, rank, "
                         "alpha) and train it first")
    settings = {(m.rank, m.alpha, getattr(m.lora_dropout, "p", 0.0)) for m in layers.values()}
    settings |= {(m.rank, m.alpha, 0.0) for m in experts.values()}
    if len(settings) != 1:
        raise ValueError(f"LoRA layers with different (rank, alpha, dropout) {sorted(settings)}: a peft adapter "
                         "has one r / lora_alpha / lora_dropout")
    rank, alpha, dropout = settings.pop()
    hf_names = _hf_module_names(model, sorted(layers))
    hf_experts = _hf_module_names(model, sorted(experts))
    head = getattr(type(model), "head", "")
    _check_peft_reads_back(model, hf_names, head)
    if base_dir is not None:
        with without_lora(model):
            model.save_pretrained(base_dir, format="hf")
        base_model_name_or_path = base_model_name_or_path or str(Path(base_dir).resolve())
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": TASK_TYPES.get(head),
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        # Exact module names: peft matches a name equal to a target (or ending in ".target"), so
        # only the layers sampan adapted are adapted.
        "target_modules": sorted(hf_names.values()) if hf_names or not experts else None,
        # peft's ParamWrapper on stacked expert weights, by full parameter name.
        "target_parameters": sorted(f"{hf_experts[name]}.{param}" for name, layer in experts.items()
                                    for param in layer.adapted_params) or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }
    tensors = {}
    for name, layer in layers.items():
        prefix = f"base_model.model.{hf_names[name]}"
        tensors[f"{prefix}.lora_A.weight"] = layer.lora_A.detach().to("cpu", copy=True).contiguous()
        tensors[f"{prefix}.lora_B.weight"] = layer.lora_B.detach().to("cpu", copy=True).contiguous()
    for name, layer in experts.items():
        for param, prefix in _expert_keys(layer, hf_experts[name]).items():
            tensors[f"{prefix}lora_A.weight"] = layer.lora_A[param].detach().to("cpu", copy=True).contiguous()
            tensors[f"{prefix}lora_B.weight"] = layer.lora_B[param].detach().to("cpu", copy=True).contiguous()
    with atomic_dir(adapter_dir) as tmp:
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt", "producer": "sampan"})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return Path(adapter_dir)


def load_peft_adapter(model: nn.Module, adapter_dir: str | os.PathLike) -> int:
    """Load a peft LoRA adapter (``adapter_model.safetensors``, as :func:`save_peft_adapter` writes it
    or peft saves it) into ``model``'s LoRA layers, matched by their Hugging Face module names;
    returns how many layers were filled. A LoRA layer the file lacks is an error naming it."""
    import torch
    from safetensors.torch import load_file

    layers = lora_layers(model)
    experts = lora_experts(model)
    if not layers and not experts:
        raise ValueError("the model has no LoRA layers to load into: apply_lora with the adapter's targets first")
    path = Path(adapter_dir) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {adapter_dir} is not a peft adapter directory")
    hf_names = _hf_module_names(model, sorted(layers))
    tensors = load_file(str(path))
    with torch.no_grad():
        for name, layer in layers.items():
            prefix = f"base_model.model.{hf_names[name]}"
            for part in ("lora_A", "lora_B"):
                key = f"{prefix}.{part}.weight"
                if key not in tensors:
                    raise ValueError(f"{path} lacks {key} (LoRA layer {name})")
                getattr(layer, part).copy_(tensors[key])
        for name, layer in experts.items():
            for param, prefix in _expert_keys(layer, _hf_module_names(model, [name])[name]).items():
                for part in ("lora_A", "lora_B"):
                    key = f"{prefix}{part}.weight"
                    if key not in tensors:
                        raise ValueError(f"{path} lacks {key} (LoRA on {name}.{param})")
                    getattr(layer, part)[param].copy_(tensors[key])
    return len(layers) + len(experts)

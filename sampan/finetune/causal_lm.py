"""A causal-LM fine-tune's base and product: load a base + tokenizer, apply a method, save, load back.

Shared by chat SFT (``chat_sft.py``) and DPO (``dpo_*.py``)::

    base = load_causal_lm("Qwen2.5-0.5B-Instruct")          # a sampan / HF directory or a store name
    info = apply_causal_method(base.model, "lora", {"lora_rank": 8, "lora_alpha": 16})
    ... train base.model ...
    save_causal_lm(base, out, "lora", info.method_args, save="merged", meta={...})
    model, tokenizer, meta = load_chat_model(out)

Methods: "full" (every weight trains), "lora" (``LoRALinear`` on the family's attention
projections, or the ``lora_targets`` named; only the low-rank factors train) and "adapter"
(Houlsby bottleneck adapters after each attention and MLP output; the adapters and the norms
train). The output directory (``save_causal_lm``) is a Hugging Face model directory that
``transformers`` and ``sampan.models.from_pretrained`` open as it is, with the tokenizer and its
chat template beside it:

* ``save="merged"``: ``config.json`` + ``model.safetensors`` (LoRA folded in) + tokenizer files
  + ``task.json``; with LoRA also ``adapter/``, a ``peft`` adapter over the base directory
  (``PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out / "adapter")``).
  With adapters the weights, adapters included, are in sampan's format (Hugging Face has no
  bottleneck adapter, and a loader that dropped them would give the wrong model in silence):
  ``load_chat_model`` opens it, and transformers or a plain ``from_pretrained`` refuse it.
* ``save="adapter"`` (LoRA only): ``adapter/`` and the tokenizer files, no weights; ``task.json``
  names the base directory (``peft_base``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sampan.finetune.adapter import apply_adapters
from sampan.finetune.config import DEFAULT_LORA_TARGETS, FinetuneConfig
from sampan.finetune.lora import apply_lora, merge_lora
from sampan.finetune.peft_format import load_peft_adapter, save_peft_adapter
from sampan.store.model_dir import TASK_FILE
from sampan.text.pretrained_tokenizer import PretrainedTokenizer
from sampan.utils.atomic import move_into_place
from sampan.utils.json_file import read_json_object

PEFT_DIR = "adapter"  # the peft adapter of a LoRA run, inside the output directory
CAUSAL_METHODS = ("full", "lora", "adapter")
BAD_RECORDS_FILE = "bad_records.jsonl"  # a chat / DPO run's skipped records, inside the output directory

# Per family (``ModelSpec.family``): LoRA's default targets (attention), the MLP projections LoRA
# may add, and where bottleneck adapters go (attention output, MLP output).
ATTENTION_TARGETS = {"llama": ("q_proj", "k_proj", "v_proj", "o_proj"),
                     "gpt": ("q_proj", "k_proj", "v_proj", "out_proj"),
                     "qwen_moe": ("q_proj", "k_proj", "v_proj", "o_proj"),
                     "ernie4_5": ("q_proj", "k_proj", "v_proj", "o_proj"),
                     "deepseek_v3": ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")}
# MoE families: "experts" is LoRA on the routed experts' stacked weights (sampan.finetune.lora.LoRAExperts).
MLP_TARGETS = {"llama": ("gate_proj", "up_proj", "down_proj"), "gpt": ("fc1", "fc2"),
               **dict.fromkeys(("qwen_moe", "ernie4_5", "deepseek_v3"), ("gate_proj", "up_proj", "down_proj", "experts"))}
ADAPTER_POINTS = {"llama": ("o_proj", "down_proj"), "gpt": ("out_proj", "fc2")}


@dataclasses.dataclass
class CausalLM:
    """A causal LM to fine-tune, with what it came with.

    Fields:
        model: the sampan model (head ``causal_lm``), fp32 unless asked otherwise, in train mode.
        tokenizer: its ``PretrainedTokenizer`` (ids as ``transformers.AutoTokenizer`` gives them),
            holding the chat template that renders conversations.
        directory: the base model directory (what a peft adapter names as its base).
        name: what the caller asked for (a directory or a store name).
        family: the model family (``"llama"`` for Llama / Qwen2 / Qwen3, ``"gpt"``).
    """

    model: nn.Module
    tokenizer: PretrainedTokenizer
    directory: Path
    name: str
    family: str


@dataclasses.dataclass
class MethodInfo:
    """What ``apply_causal_method`` did.

    Fields:
        method: "full", "lora" or "adapter".
        method_args: the settings it used (rank, alpha, dropout and the module names for LoRA;
            ``adapter_size`` and the wrapped layers for adapters), as ``task.json`` stores them.
        trainable_parameters: parameters that train.
        total_parameters: parameters of the model as trained (LoRA factors and adapters included).
    """

    method: str
    method_args: dict[str, Any]
    trainable_parameters: int
    total_parameters: int


def _family(model: nn.Module) -> str:
    from sampan.models.registry import spec_of

    spec = spec_of(model)
    return spec.family if spec is not None else type(model).__name__


def _resolve_directory(model: str) -> Path:
    path = Path(model)
    if path.is_dir():
        return path
    from sampan.store.models import ModelNotFoundError, resolve

    try:
        return resolve(model)
    except ModelNotFoundError:
        raise FileNotFoundError(
            f"causal LM {model!r} is neither a model directory nor a stored model (`sampan hub list`); give a "
            "directory holding config.json, the weights and tokenizer.json (sampan's or a Hugging Face checkpoint "
            "such as Qwen2.5-0.5B-Instruct)") from None


def load_chat_template(value: str) -> str:
    """A chat template given as Jinja text, or as the path of a ``.jinja`` file holding it."""
    if "{" not in value and Path(value).is_file():
        return Path(value).read_text(encoding="utf-8")
    if "{" not in value:
        raise FileNotFoundError(f"chat_template {value!r} is neither a Jinja template nor an existing file")
    return value


def load_causal_lm(model: str | os.PathLike, chat_template: str | None = None,
                   dtype: torch.dtype = torch.float32) -> CausalLM:
    """Open ``model`` (a sampan or Hugging Face directory, or a store name) and its tokenizer.

    The weights load in ``dtype`` (fp32 by default: the optimizer's master weights), the head
    must be a causal LM, and the tokenizer must fit the embedding table. ``chat_template`` (Jinja
    text or a ``.jinja`` path) replaces the tokenizer's own template, or gives one to a base
    model's tokenizer that has none.
    """
    from sampan.models import from_pretrained

    directory = _resolve_directory(str(model))
    if not (directory / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{directory}/tokenizer.json not found: a causal LM to fine-tune needs the tokenizer "
                                "it was trained with beside its weights")
    loaded = from_pretrained(directory, dtype=dtype)
    if getattr(type(loaded), "head", "") != "causal_lm":
        raise ValueError(f"{directory} holds a {type(loaded).__name__} (head {getattr(type(loaded), 'head', '?')!r}); "
                         "chat fine-tuning needs a causal language model (Llama / Qwen / GPT ...ForCausalLM)")
    tokenizer = PretrainedTokenizer.from_pretrained(directory)
    if chat_template is not None:
        tokenizer.chat_template = load_chat_template(chat_template)
    vocab = loaded.config.vocab_size
    if len(tokenizer) > vocab:
        raise ValueError(f"{directory}: the tokenizer has {len(tokenizer)} tokens but the model's embedding table "
                         f"{vocab}; they do not belong together")
    loaded.train()
    return CausalLM(loaded, tokenizer, directory, str(model), _family(loaded))


def lora_targets_for(model: nn.Module, requested: Sequence[str] | None = None) -> tuple[str, ...]:
    """The linear-layer names LoRA adapts: ``requested``, or the family's attention projections.

    ``"mlp"`` in ``requested`` stands for the family's MLP projections and ``"attention"`` for its
    attention ones (``("attention", "mlp")``: every linear layer of the blocks).
    """
    family = _family(model)
    names: list[str] = []
    for name in requested or ("attention",):
        if name == "attention":
            names += ATTENTION_TARGETS.get(family, ())
        elif name == "mlp":
            names += MLP_TARGETS.get(family, ())
        else:
            names.append(name)
    if not names:
        raise ValueError(f"no default LoRA targets for the {family} family: name the linear layers (lora_targets)")
    return tuple(dict.fromkeys(names))


def _norm_parameters(model: nn.Module) -> set[str]:
    from sampan.nn.rms_norm import RMSNorm

    return {f"{m}.{p}" if m else p for m, mod in model.named_modules() if isinstance(mod, (nn.LayerNorm, RMSNorm,
                                                                                              nn.RMSNorm))
            for p, _ in mod.named_parameters(recurse=False)}


def apply_causal_method(model: nn.Module, method: str, method_args: Mapping[str, Any] | None = None,
                        freeze: Sequence[str] = ()) -> MethodInfo:
    """Insert LoRA / adapters into ``model`` and set which parameters train; returns ``MethodInfo``.

    ``method_args``: for "lora" ``lora_rank`` (8), ``lora_alpha`` (16), ``lora_dropout`` (0) and
    ``lora_targets`` (see :func:`lora_targets_for`); for "adapter" ``adapter_size`` (64). LoRA's
    init uses torch's global generator: seed it first for a reproducible run. ``freeze`` holds
    base parameters whose name starts with one of its prefixes (a prefix naming nothing is an
    error); inserted LoRA factors and adapters always train.
    """
    args = dict(method_args or {})
    family = _family(model)
    if method == "lora":
        targets = lora_targets_for(model, args.get("lora_targets"))
        rank, alpha = int(args.get("lora_rank", 8)), float(args.get("lora_alpha", 16.0))
        dropout = float(args.get("lora_dropout", 0.0))
        model.requires_grad_(False)
        layers = apply_lora(model, targets, rank, alpha, dropout, within="")
        args = {"lora_rank": rank, "lora_alpha": alpha, "lora_dropout": dropout, "lora_targets": list(targets),
                "lora_layers": len(layers)}
    elif method == "adapter":
        size = int(args.get("adapter_size", 64))
        points = ADAPTER_POINTS.get(family)
        if points is None:
            raise ValueError(f"no adapter placement known for the {family} family; use method 'lora' or 'full'")
        model.requires_grad_(False)
        layers = apply_adapters(model, size, within="", points=points)
        norms = _norm_parameters(model)
        for name, param in model.named_parameters():
            param.requires_grad_(".adapter." in name or name in norms)
        args = {"adapter_size": size, "adapter_points": list(points), "adapter_layers": len(layers)}
    elif method == "full":
        model.requires_grad_(True)
        args = {}
    else:
        raise ValueError(f"unknown method {method!r}; methods: {', '.join(CAUSAL_METHODS)}")
    names = [n for n, _ in model.named_parameters()]
    unknown = [f for f in freeze if not any(n.startswith(f) for n in names)]
    if unknown:
        raise ValueError(f"freeze prefixes {unknown} name no parameter of the model; its parameters start with e.g. "
                         f"{sorted({n.rsplit('.', 2)[0] for n in names})[:6]}")
    for name, param in model.named_parameters():
        if name.startswith(tuple(freeze)) and ".lora_" not in name and ".adapter." not in name:
            param.requires_grad_(False)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if trainable == 0:
        raise ValueError("nothing trains: freeze holds every parameter the method would train")
    return MethodInfo(method, args, trainable, sum(p.numel() for p in model.parameters()))


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    import json

    from sampan.utils.atomic import atomic_write

    atomic_write(path, json.dumps(dict(data), indent=2, ensure_ascii=False, sort_keys=True) + "\n")


def _move_files_into(src: Path, out: Path) -> None:
    for item in sorted(src.iterdir()):
        if item.is_file():
            move_into_place(item, out / item.name)
        else:  # a tokenizer's additional_chat_templates/
            if (out / item.name).exists():
                shutil.rmtree(out / item.name)
            move_into_place(item, out / item.name)


def save_causal_lm(base: CausalLM, out: str | os.PathLike, method: str, method_args: Mapping[str, Any],
                   save: str = "merged", meta: Mapping[str, Any] | None = None) -> Path:
    """Write ``base.model`` (as trained) and its tokenizer into ``out`` in the layout the module
    docstring describes, with ``meta`` (plus the method and base) as ``task.json``; returns ``out``.

    ``save="merged"`` folds LoRA into the weights of ``base.model`` in place (write the peft
    adapter first: this function does). Other files already in ``out`` (a training run) stay.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = base.model
    record = {**dict(meta or {}), "method": method, "method_args": dict(method_args), "save": save,
              "base_model": str(base.directory.resolve()), "family": base.family}
    if save not in ("merged", "adapter"):
        raise ValueError(f"save must be 'merged' or 'adapter', got {save!r}")
    if save == "adapter" and method != "lora":
        raise ValueError(f"save='adapter' writes a peft LoRA adapter; method {method!r} has none: use save='merged'")
    if method == "lora":
        try:
            save_peft_adapter(model, out / PEFT_DIR, base_model_name_or_path=str(base.directory.resolve()))
            record["peft_adapter"] = PEFT_DIR
        except ValueError as err:  # GPT-2's fused attention has no peft module names
            if save == "adapter":
                raise
            record["peft_adapter"] = None
            record["peft_adapter_skipped"] = str(err)
    with tempfile.TemporaryDirectory(prefix=".model-", dir=out) as tmp:
        staged = Path(tmp) / "model"
        if save == "adapter":
            staged.mkdir()
            base.tokenizer.save_pretrained(staged)
            record["peft_base"] = record["base_model"]
        elif method == "adapter":
            # Hugging Face has no bottleneck adapter: a directory that transformers or a plain
            # from_pretrained would open without them would serve the wrong model in silence. So
            # the weights (adapters included) go in sampan's format, which both refuse loudly
            # (unexpected adapter tensors / no model_type); load_chat_model opens it.
            model.save_pretrained(staged, format="sampan", tokenizer=base.tokenizer)
            record["format"] = "sampan"
        else:
            merge_lora(model)
            fmt = "hf" if _has_hf_format(model) else "sampan"
            model.save_pretrained(staged, format=fmt, tokenizer=base.tokenizer)
            record["format"] = fmt
        _move_files_into(staged, out)
    _write_json(out / TASK_FILE, {"task": record.pop("task", "chat"), **record})
    return out


def _has_hf_format(model: nn.Module) -> bool:
    from sampan.models.registry import spec_of

    spec = spec_of(model)
    return spec is not None and spec.hf is not None


def load_chat_model(directory: str | os.PathLike, dtype: torch.dtype | None = None):
    """A fine-tuned causal LM written by :func:`save_causal_lm`: ``(model in eval mode, tokenizer, task.json)``.

    Adapter weights are put back over the saved weights; a LoRA adapter-only directory loads its
    base (``peft_base``) and merges the adapter in.
    """
    from sampan.models import from_pretrained

    directory = Path(directory)
    meta = read_json_object(directory / TASK_FILE) if (directory / TASK_FILE).is_file() else {}
    tokenizer = PretrainedTokenizer.from_pretrained(directory)
    if meta.get("save") == "adapter":
        base = Path(meta["peft_base"])
        if not base.is_dir():
            raise FileNotFoundError(f"{directory} is a LoRA adapter over {base}, which is missing; ship the base too "
                                    "or fine-tune with save='merged'")
        model = from_pretrained(base, dtype=dtype)
        args = meta["method_args"]
        apply_lora(model, args["lora_targets"], args["lora_rank"], args["lora_alpha"], within="")
        load_peft_adapter(model, directory / PEFT_DIR)
        merge_lora(model)
    elif meta.get("method") == "adapter":
        model = _with_adapters(directory, meta["method_args"], dtype)
    else:
        model = from_pretrained(directory, dtype=dtype)
    model.requires_grad_(False)
    return model.eval(), tokenizer, meta


def _with_adapters(directory: Path, args: Mapping[str, Any], dtype: torch.dtype | None) -> nn.Module:
    """A sampan directory whose weights hold bottleneck adapters: the model built from its config,
    the adapters inserted, then every tensor loaded strictly."""
    from sampan.models.loading import build_empty, load_tensors
    from sampan.models.pretrained import read_config
    from sampan.models.registry import architecture_class
    from sampan.models.weight_files import iter_tensors, stored_float_dtype, weight_files

    data = read_config(directory)
    cls = architecture_class(str(data.pop("architecture", "")))
    if cls is None:
        raise ValueError(f"{directory}/config.json names no sampan architecture; an adapter-method chat model is "
                         "saved in sampan's format")
    files = weight_files(directory)
    model = build_empty(cls, cls.config_class.from_dict(data), None, dtype or stored_float_dtype(files))
    apply_adapters(model, args["adapter_size"], within="", points=tuple(args["adapter_points"]))
    load_tensors(model, iter_tensors(files), str(directory))
    return model


def prepare_output_dir(path: Path, overwrite: bool, resuming: bool) -> None:
    """Make ``path`` ready for a causal-LM run: kept when resuming, refused when it holds
    something and ``overwrite`` is off, else cleared (chat SFT and DPO share it)."""
    if resuming:  # the run to continue lives in it
        path.mkdir(parents=True, exist_ok=True)
        return
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            raise ValueError(f"output directory {path} is not empty; set training.overwrite_output_dir (--overwrite) "
                             "to replace it, --resume to continue the run in it, or choose another "
                             "training.output_dir (--output-dir)")
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)


def method_args(cfg: FinetuneConfig) -> dict[str, Any]:
    """The method's settings from the config (LoRA's default targets are the family's attention
    projections: ERNIE's default names mean "the default" here)."""
    if cfg.method == "lora":
        targets = None if tuple(cfg.lora_targets) == DEFAULT_LORA_TARGETS else list(cfg.lora_targets)
        return {"lora_rank": cfg.lora_rank, "lora_alpha": cfg.lora_alpha, "lora_dropout": cfg.lora_dropout,
                "lora_targets": targets}
    if cfg.method == "adapter":
        return {"adapter_size": cfg.adapter_size}
    return {}

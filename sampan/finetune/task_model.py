"""Fine-tuning methods on a task model, the output directory layouts, and ``load_task_model``.

Layouts (``task.json`` says which):

* merged: ``config.json`` + ``model.safetensors`` (``save_pretrained`` of the task model, LoRA
  folded into the base weights) + ``tokenizer.json`` + ``task.json``. A LoRA or full model loads
  with plain ``sampan.models.from_pretrained`` too; an adapter model holds the adapter tensors as
  well and loads through ``load_task_model`` (adapters cannot be folded into the weights).
* adapter: ``adapter.safetensors`` (only the trained tensors: LoRA / adapter, new head, and for
  adapters the LayerNorms) + ``tokenizer.json`` + ``task.json`` whose ``base_model_dir`` is the
  base directory relative to this one, so the two directories can move together.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from sampan.finetune.adapter import apply_adapters
from sampan.finetune.base import HEAD_PREFIXES, HEADS, BaseModel, build_task_model, load_base
from sampan.finetune.lora import apply_embedding_lora, apply_lora, merge_lora
from sampan.models.pretrained import CONFIG_NAME, WEIGHTS_NAME, load_safetensors, read_config
from sampan.store.model_dir import TASK_FILE, ModelDir
from sampan.text.tokenizer import ChineseTokenizer
from sampan.utils.atomic import atomic_write, move_into_place

ADAPTER_WEIGHTS = "adapter.safetensors"
TOKENIZER_FILE = "tokenizer.json"
FEATURES_FILE = "features.json"


def apply_method(model: torch.nn.Module, method: str, method_args: dict[str, Any], new_head: list[str],
                 freeze: Sequence[str] = ()) -> None:
    """Insert LoRA / adapters and set which parameters train.

    full: everything. lora: the LoRA matrices and the newly initialised head. adapter: the
    adapters, every LayerNorm (as Houlsby et al. train them) and the new head.
    ``method_args["embedding_lora_rank"]`` > 0 also gives the word-embedding table a low-rank
    update (``LoRAEmbedding``), whatever the method. Then the base's parameters whose name starts
    with one of ``freeze`` are held at the base's values; what the method inserted (LoRA factors,
    adapters) has no base value to hold and always trains, so freezing the table and updating it
    go together. A prefix that names no parameter is an error (a typo would otherwise silently
    train everything).
    """
    if method_args.get("embedding_lora_rank", 0):
        apply_embedding_lora(model, method_args["embedding_lora_rank"], method_args["embedding_lora_alpha"])
    if method == "lora":
        apply_lora(model, method_args["lora_targets"], method_args["lora_rank"], method_args["lora_alpha"],
                   method_args.get("lora_dropout", 0.0))
    elif method == "adapter":
        apply_adapters(model, method_args["adapter_size"])
    elif method != "full":
        raise ValueError(f"unknown method {method!r}; methods: full, lora, adapter")
    # The classifier always trains; other head tensors (the pooler) train when they are new. Encoder
    # tensors listed as new (a random-init base) stay frozen: the method decides what trains there.
    head = {n for n in new_head if n.startswith(HEAD_PREFIXES)}
    head |= {n for n, _ in model.named_parameters() if n.startswith("classifier.")}
    norms = {f"{m}.{p}" for m, mod in model.named_modules() if isinstance(mod, torch.nn.LayerNorm)
             for p, _ in mod.named_parameters(recurse=False)}
    for name, param in model.named_parameters():
        inserted = ".lora_" in name or ".adapter." in name
        if method == "full":
            trainable = True
        elif method == "lora":
            trainable = ".lora_" in name or name in head
        else:
            trainable = ".adapter." in name or name in head or name in norms
        param.requires_grad_(inserted or (trainable and not name.startswith(tuple(freeze))))
    names = [n for n, _ in model.named_parameters()]
    unknown = [f for f in freeze if not any(n.startswith(f) for n in names)]
    if unknown:
        raise ValueError(f"freeze prefixes {unknown} name no parameter of the task model; its parameters "
                         f"start with e.g. {sorted({n.rsplit('.', 2)[0] for n in names})[:6]}")


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors that train (what an adapter file holds), detached copies on CPU."""
    return {n: p.detach().to("cpu").clone().contiguous() for n, p in model.named_parameters() if p.requires_grad}


def _method_args(meta: dict[str, Any]) -> dict[str, Any]:
    return dict(meta.get("method_args", {}))


def write_json(path: Path, data: dict[str, Any], sort_keys: bool = True) -> None:
    """Write ``path`` whole or not at all (a temporary file renamed over it)."""
    atomic_write(path, json.dumps(data, indent=2, ensure_ascii=False, sort_keys=sort_keys) + "\n")


def save_task_model(model: torch.nn.Module, out: Path, meta: dict[str, Any], base: BaseModel, save: str) -> None:
    """Write the model into ``out`` in the ``save`` layout (merges LoRA in place for "merged")."""
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(meta)
    if save == "adapter":
        if base.directory is None:
            raise ValueError("save='adapter' needs a base model directory to point at; a config name starts from "
                             "random weights that no later run can rebuild: use save='merged'")
        save_file(trainable_state(model), str(out / ADAPTER_WEIGHTS), metadata={"format": "pt", "producer": "sampan"})
        meta["base_model_dir"] = os.path.relpath(base.directory.resolve(), out.resolve())
    else:
        merge_lora(model)
        # save_pretrained replaces the directory it writes: write beside, then move the two files in.
        with tempfile.TemporaryDirectory(prefix=".model-", dir=out) as tmp:
            model.save_pretrained(Path(tmp) / "model")
            for name in (CONFIG_NAME, WEIGHTS_NAME):
                move_into_place(Path(tmp) / "model" / name, out / name)
    base.tokenizer.save(out / TOKENIZER_FILE)
    if base.feature_names:
        shutil.copyfile(base.directory / FEATURES_FILE, out / FEATURES_FILE)
    write_json(out / TASK_FILE, meta)


def read_task_meta(model_dir: str | os.PathLike) -> dict[str, Any]:
    """``task.json`` of a fine-tuned model directory, with a clear error when it is not one."""
    directory = ModelDir(Path(model_dir))
    meta, path = directory.task_meta, directory.task_file
    if meta is None:
        raise FileNotFoundError(f"{path} not found: {model_dir} is not a fine-tuned model directory "
                                "(`sampan finetune` writes task.json beside the weights)")
    for key in ("task", "labels", "method"):
        if key not in meta:
            raise ValueError(f"{path} lacks {key!r}; re-run `sampan finetune` to rewrite it")
    return meta


def load_task_model(model_dir: str | os.PathLike) -> tuple[torch.nn.Module, ChineseTokenizer, dict[str, Any]]:
    """Load a fine-tuned model: ``(model in eval mode, tokenizer, task.json as a dict)``.

    Reads either layout. For the adapter layout the base comes from ``base_model_dir`` (relative
    to ``model_dir``), the trained tensors are loaded over it and LoRA is merged, so the model
    returned is a plain sampan model (an adapter-method model keeps its adapter modules).
    """
    model_dir = Path(model_dir)
    meta = read_task_meta(model_dir)
    task, labels, method = meta["task"], meta["labels"], meta["method"]
    if task not in HEADS:
        raise ValueError(f"{model_dir}/{TASK_FILE}: unknown task {task!r}")
    base_of = ModelDir(model_dir).base  # a missing base is an error naming both directories
    if base_of is not None:
        base_dir = base_of.path
        base = load_base(str(base_dir))
        model, _ = build_task_model(base, task, len(labels), seed=0, max_length=meta.get("max_length", 3),
                                    overrides=meta.get("config_overrides"))
        apply_method(model, method, _method_args(meta), new_head=[])
        names = load_safetensors(model, model_dir / ADAPTER_WEIGHTS, partial=True)
        missing_lora = [n for n, _ in model.named_parameters() if (".lora_" in n or ".adapter." in n) and n not in names]
        if missing_lora:
            raise ValueError(f"{model_dir / ADAPTER_WEIGHTS} lacks trained tensors {missing_lora[:8]}")
        merge_lora(model)
        tokenizer_dir = model_dir if (model_dir / TOKENIZER_FILE).is_file() else base_dir
    else:
        if method == "adapter":
            from sampan.finetune.base import _ernie_config
            from sampan.models import create

            config, _ = _ernie_config(dict(read_config(model_dir)), str(model_dir / CONFIG_NAME))
            model = create(config, head=HEADS[task])
            apply_adapters(model, _method_args(meta)["adapter_size"])
            load_safetensors(model, model_dir / WEIGHTS_NAME)
        else:
            from sampan.models import from_pretrained

            model = from_pretrained(model_dir)
        tokenizer_dir = model_dir
    model.requires_grad_(False)
    return model.eval(), ChineseTokenizer.load(tokenizer_dir / TOKENIZER_FILE), meta

"""Load a local Hugging Face BERT checkpoint into sampan's ERNIE.

Only weights are read: ``model.safetensors`` (or a sharded ``model.safetensors.index.json``), and
as a fallback the legacy ``pytorch_model.bin`` (or its sharded index) through
``torch.load(weights_only=True)``, which refuses anything but tensors and plain containers.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from sampan.models.ernie.config import ErnieConfig
from sampan.models.ernie.modeling import (
    ErnieForMaskedLM,
    ErnieForSequenceClassification,
    ErnieForTokenClassification,
    ErnieModel,
)

ErnieAny = ErnieModel | ErnieForMaskedLM | ErnieForSequenceClassification | ErnieForTokenClassification

HEAD_CLASSES: dict[str, type[ErnieAny]] = {
    "none": ErnieModel,
    "masked_lm": ErnieForMaskedLM,
    "sequence_classification": ErnieForSequenceClassification,
    "token_classification": ErnieForTokenClassification,
}

# Weight files in order of preference; an index file maps tensor names to shard files.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json")

# HF hidden_act -> sampan activation (the gelu variants are the same functions up to rounding).
ACTIVATIONS = {
    "gelu": "gelu", "gelu_python": "gelu",
    "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
    "relu": "relu", "silu": "silu", "swish": "silu",
}

# HF config.json field -> ErnieConfig field (copied when present).
CONFIG_FIELDS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "intermediate_size": "intermediate_size",
    "hidden_dropout_prob": "dropout",
    "attention_probs_dropout_prob": "attention_dropout",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
    "layer_norm_eps": "layer_norm_eps",
    "pad_token_id": "pad_token_id",
    "initializer_range": "initializer_range",
    "classifier_dropout": "classifier_dropout",
}

# HF module path -> sampan module path. Encoder entries get the "ernie." prefix inside head models;
# "{i}" is the layer index. The parameter name (weight / bias; legacy gamma / beta) is kept.
ENCODER_MODULES = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
    "embeddings.LayerNorm": "embeddings.norm",
    "encoder.layer.{i}.attention.self.query": "layers.{i}.attn.q_proj",
    "encoder.layer.{i}.attention.self.key": "layers.{i}.attn.k_proj",
    "encoder.layer.{i}.attention.self.value": "layers.{i}.attn.v_proj",
    "encoder.layer.{i}.attention.output.dense": "layers.{i}.attn.out_proj",
    "encoder.layer.{i}.attention.output.LayerNorm": "layers.{i}.norm1",
    "encoder.layer.{i}.intermediate.dense": "layers.{i}.mlp.fc1",
    "encoder.layer.{i}.output.dense": "layers.{i}.mlp.fc2",
    "encoder.layer.{i}.output.LayerNorm": "layers.{i}.norm2",
    "pooler.dense": "pooler.dense",
}
HEAD_MODULES = {
    "cls.predictions.transform.dense": "lm_head.transform",
    "cls.predictions.transform.LayerNorm": "lm_head.norm",
    "classifier": "classifier",
}
# Whole tensors with no module/parameter split.
SPECIAL_TENSORS = {"cls.predictions.bias": "lm_head.decoder.bias",
                   "cls.predictions.decoder.bias": "lm_head.decoder.bias"}
# The tied MLM decoder: not loaded, only checked against the word embedding.
TIED_DECODER = "cls.predictions.decoder.weight"
# HF keys never loaded: buffers and the next-sentence head.
IGNORED = re.compile(r"embeddings\.(position_ids|token_type_ids)|cls\.seq_relationship\..*")
# Parts of a checkpoint that a head without them skips (a pretraining checkpoint has a pooler and
# an MLM head; loading it as a bare encoder or a token classifier drops what it does not use).
OPTIONAL_PARTS = ("pooler.", "lm_head.", "classifier.")
PARAM_RENAMES = {"gamma": "weight", "beta": "bias"}


def _module_pattern(template: str) -> re.Pattern[str]:
    return re.compile(re.escape(template).replace(re.escape("{i}"), r"(?P<i>\d+)"))


_ENCODER_PATTERNS = [(_module_pattern(hf), ours) for hf, ours in ENCODER_MODULES.items()]


def _sampan_name(hf_key: str, prefix: str) -> str | None:
    """The sampan parameter name for an HF key (without "bert."), or None when nothing maps it."""
    if hf_key in SPECIAL_TENSORS:
        return SPECIAL_TENSORS[hf_key]
    module, _, param = hf_key.rpartition(".")
    param = PARAM_RENAMES.get(param, param)
    if module in HEAD_MODULES:
        return f"{HEAD_MODULES[module]}.{param}"
    for pattern, ours in _ENCODER_PATTERNS:
        match = pattern.fullmatch(module)
        if match:
            return prefix + ours.format(**match.groupdict()) + f".{param}"
    return None


def _read_hf_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {directory} is not a Hugging Face model directory")
    return json.loads(path.read_text(encoding="utf-8"))


def ernie_config_from_hf(hf: dict[str, Any]) -> ErnieConfig:
    """Map a Hugging Face ``BertConfig`` dict (``config.json``) to an ``ErnieConfig``."""
    model_type = hf.get("model_type", "bert")
    if model_type != "bert":
        raise ValueError(f"model_type {model_type!r} is not supported: from_hf_bert loads BERT checkpoints only")
    position = hf.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(f"position_embedding_type {position!r} is not supported: sampan's ERNIE only has "
                         "learned absolute position embeddings")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise ValueError(f"{flag}=True is not supported: sampan's ERNIE is an encoder without cross-attention")
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    fields: dict[str, Any] = {ours: hf[theirs] for theirs, ours in CONFIG_FIELDS.items() if theirs in hf}
    fields["activation"] = ACTIVATIONS[act]
    if hf.get("id2label"):
        fields["num_labels"] = len(hf["id2label"])
    elif "num_labels" in hf:
        fields["num_labels"] = hf["num_labels"]
    return ErnieConfig(**fields)


def _check_shard_name(directory: Path, name: str) -> Path:
    if Path(name).name != name or name in ("", ".", ".."):
        raise ValueError(f"{directory}: shard file name {name!r} must be a plain file name in the directory")
    path = directory / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (listed in the checkpoint's index file)")
    return path


def _load_file(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        return load_file(str(path), device="cpu")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} is not a state dict of tensors")
    return state


def load_hf_state_dict(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of a HF checkpoint directory on the CPU, under their HF names."""
    directory = Path(directory)
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return _load_file(path)
        weight_map = json.loads(path.read_text(encoding="utf-8")).get("weight_map", {})
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(_load_file(_check_shard_name(directory, shard)))
        return state
    raise FileNotFoundError(f"no weights in {directory}: expected one of {', '.join(WEIGHT_FILES)}")


def _detect_head(keys: set[str], hf_config: dict[str, Any]) -> str:
    if any(k.startswith("cls.predictions.") for k in keys):
        return "masked_lm"
    if "classifier.weight" not in keys:
        return "none"
    archs = hf_config.get("architectures") or []
    for arch in archs:
        if arch.endswith("ForSequenceClassification"):
            return "sequence_classification"
        if arch.endswith("ForTokenClassification"):
            return "token_classification"
    if archs:
        raise ValueError(f"cannot tell which classifier the checkpoint's architectures {archs} have; "
                         f"pass head= (one of {list(ErnieConfig.HEADS)})")
    # No architectures recorded: BERT's sequence classifier has a pooler, its token classifier none.
    return "sequence_classification" if "pooler.dense.weight" in keys else "token_classification"


def from_hf_bert(directory: str | os.PathLike, head: str | None = None,
                 device: str | torch.device | None = None) -> ErnieAny:
    """Load a local Hugging Face BERT checkpoint directory into sampan's ERNIE, in eval mode.

    ``directory`` holds ``config.json`` and the weights of a ``BertModel``, ``BertForMaskedLM``
    (or ``BertForPreTraining``), ``BertForSequenceClassification`` or ``BertForTokenClassification``.
    ``head=None`` picks the head from the weights: an MLM head -> "masked_lm", a classifier ->
    sequence or token classification (from ``architectures`` in config.json), else "none".
    An explicit head skips checkpoint parts it has no use for (the pooler, the MLM head, the
    classifier); every tensor the sampan model has must come from the checkpoint. Weights are
    loaded in float32 on ``device`` (default CPU).

    Example::

        from sampan.models.ernie import from_hf_bert
        model = from_hf_bert("./bert-base-chinese")            # ErnieForMaskedLM
        encoder = from_hf_bert("./bert-base-chinese", head="none")
        sequence_output, pooled = encoder(input_ids, token_type_ids, attention_mask)

    Unlike HF's ``BertModel``, sampan's ERNIE masks ``pad_token_id`` positions when no
    ``attention_mask`` is given; pass the mask to reproduce HF exactly.
    """
    directory = Path(directory)
    hf_config = _read_hf_config(directory)
    config = ernie_config_from_hf(hf_config)
    state = {k.removeprefix("bert."): v for k, v in load_hf_state_dict(directory).items()}
    head = _detect_head(set(state), hf_config) if head is None else config._check_head(head)

    model_cls = HEAD_CLASSES[head]
    with torch.device("meta"):
        model = model_cls(config)
    model.to_empty(device=device or "cpu")
    model.tie_weights()
    tied = model.tied_weights()
    expected = {k: v for k, v in model.state_dict().items() if k not in tied}
    prefix = "" if model_cls is ErnieModel else "ernie."

    loaded: dict[str, tuple[str, torch.Tensor]] = {}  # sampan name -> (HF key, tensor)
    unexpected: list[str] = []
    decoder = state.pop(TIED_DECODER, None)
    for key, tensor in state.items():
        if IGNORED.fullmatch(key):
            continue
        name = _sampan_name(key, prefix)
        if name is None:
            unexpected.append(key)
        elif name in expected:
            if name in loaded and not torch.equal(loaded[name][1], tensor):
                raise ValueError(f"{directory}: {loaded[name][0]} and {key} both map to {name} but differ")
            loaded[name] = (key, tensor)
        elif not name.removeprefix(prefix).startswith(OPTIONAL_PARTS):
            unexpected.append(key)
    missing = sorted(set(expected) - set(loaded))
    if missing or unexpected:
        raise ValueError(f"{directory} does not match sampan's {model_cls.__name__} (head {head!r}): "
                         f"missing {missing[:10]}, unexpected HF keys {sorted(unexpected)[:10]}")
    for name, (key, tensor) in loaded.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{directory}: {key} has shape {tuple(tensor.shape)}, sampan's {name} "
                             f"expects {tuple(expected[name].shape)}")
    if decoder is not None and head == "masked_lm":
        word = loaded[prefix + "embeddings.word_embeddings.weight"][1]
        if decoder.shape != word.shape or not torch.equal(decoder, word):
            raise ValueError(f"{directory}: {TIED_DECODER} differs from the word embedding; sampan ties the "
                             "MLM decoder to the input embedding (tie_word_embeddings=False is not supported)")
    with torch.no_grad():
        for name, (_, tensor) in loaded.items():
            expected[name].copy_(tensor)
    return model.eval()

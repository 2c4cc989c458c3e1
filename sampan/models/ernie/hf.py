"""ERNIE's Hugging Face adapter: ``bert``, ``ernie`` (ERNIE 3.0, with task types) and
``roberta-prelayernorm`` checkpoints, both ways.

sampan's ERNIE is BERT's layout: post-norm ERNIE maps to HF BERT (or HF ERNIE when it has task
types); pre-norm ERNIE (``pre_norm=True``, as the store's models are) maps to HF's pre-LayerNorm
RoBERTa, whose blocks normalise before attention and MLP and once after the last block as
sampan's do. RoBERTa counts positions from ``pad_token_id + 1``, so its position table is
sampan's shifted down by that many rows. Importing this module imports no torch (the planner
reads HF configs through it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sampan.models.ernie.config import ErnieConfig
from sampan.models.hf_names import ACTIVATIONS_TO_HF, activation_from_hf, head_from_architectures

ROOTS = {"bert": "bert.", "ernie": "ernie.", "roberta-prelayernorm": "roberta_prelayernorm."}
CLASS_PREFIX = {"bert": "Bert", "ernie": "Ernie", "roberta-prelayernorm": "RobertaPreLayerNorm"}
HEAD_SUFFIXES = {"Model": "none", "ForMaskedLM": "masked_lm", "ForPreTraining": "masked_lm",
                 "ForSequenceClassification": "sequence_classification",
                 "ForTokenClassification": "token_classification"}
HEAD_ARCHITECTURE = {"none": "Model", "masked_lm": "ForMaskedLM",
                     "sequence_classification": "ForSequenceClassification",
                     "token_classification": "ForTokenClassification"}

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

# HF module path (after the root prefix) -> sampan module path inside ErnieModel; "{i}" is the layer.
POST_NORM_MODULES = {
    "embeddings.word_embeddings": "embeddings.word_embeddings",
    "embeddings.position_embeddings": "embeddings.position_embeddings",
    "embeddings.token_type_embeddings": "embeddings.token_type_embeddings",
    "embeddings.task_type_embeddings": "embeddings.task_type_embeddings",
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
PRE_NORM_MODULES = {
    **{k: v for k, v in POST_NORM_MODULES.items() if "LayerNorm" not in k or k.startswith("embeddings.")},
    "encoder.layer.{i}.attention.LayerNorm": "layers.{i}.norm1",
    "encoder.layer.{i}.intermediate.LayerNorm": "layers.{i}.norm2",
    "LayerNorm": "final_norm",
}
# HF head module -> sampan module (relative to the head model, not the encoder).
HEAD_MODULES = {
    "bert": {"cls.predictions.transform.dense": "lm_head.transform",
             "cls.predictions.transform.LayerNorm": "lm_head.norm",
             "cls.predictions.decoder": "lm_head.decoder",
             "classifier": "classifier"},
    "roberta-prelayernorm": {"lm_head.dense": "lm_head.transform", "lm_head.layer_norm": "lm_head.norm",
                             "lm_head.decoder": "lm_head.decoder", "classifier.dense": "ernie.pooler.dense",
                             "classifier.out_proj": "classifier", "classifier": "classifier"},
}
HEAD_MODULES["ernie"] = HEAD_MODULES["bert"]
# Whole tensors with no module / parameter split.
SPECIAL_TENSORS = {"cls.predictions.bias": "lm_head.decoder.bias", "lm_head.bias": "lm_head.decoder.bias"}
# HF tensors that are buffers or heads sampan has no use for: never loaded.
IGNORED = re.compile(r"embeddings\.(position_ids|token_type_ids)|cls\.seq_relationship\..*")
PARAM_RENAMES = {"gamma": "weight", "beta": "bias"}


def _patterns(modules: Mapping[str, str]) -> list[tuple[re.Pattern[str], str]]:
    return [(re.compile(re.escape(hf).replace(re.escape("{i}"), r"(?P<i>\d+)")), ours) for hf, ours in modules.items()]


_ENCODER_PATTERNS = {"post": _patterns(POST_NORM_MODULES), "pre": _patterns(PRE_NORM_MODULES)}


def _position_offset(config_or_hf: Any, model_type: str) -> int:
    """How many rows RoBERTa's position table has before sampan's position 0 (pad + 1)."""
    if model_type != "roberta-prelayernorm":
        return 0
    pad = config_or_hf["pad_token_id"] if isinstance(config_or_hf, Mapping) else config_or_hf.pad_token_id
    return pad + 1


def config_from_hf(hf: Mapping[str, Any]) -> ErnieConfig:
    """An ``ErnieConfig`` from a BERT, ERNIE 3.0 or pre-LayerNorm RoBERTa ``config.json``."""
    model_type = hf["model_type"]
    if model_type not in ROOTS:
        raise ValueError(f"model_type {model_type!r} is not an ERNIE-family model ({sorted(ROOTS)})")
    position = hf.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ValueError(f"position_embedding_type {position!r} is not supported: sampan's ERNIE only has "
                         "learned absolute position embeddings")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise ValueError(f"{flag}=True is not supported: sampan's ERNIE is an encoder without cross-attention")
    fields: dict[str, Any] = {ours: hf[theirs] for theirs, ours in CONFIG_FIELDS.items() if theirs in hf}
    fields["activation"] = activation_from_hf(hf, "hidden_act", "gelu")
    if hf.get("id2label"):
        fields["num_labels"] = len(hf["id2label"])
    elif "num_labels" in hf:
        fields["num_labels"] = hf["num_labels"]
    if model_type == "ernie" and hf.get("use_task_id"):
        fields["task_type_vocab_size"] = hf.get("task_type_vocab_size", 3)
    if model_type == "roberta-prelayernorm":
        if hf.get("pad_token_id") is None:
            raise ValueError("a pre-LayerNorm RoBERTa config needs pad_token_id: its positions count from it")
        fields["pre_norm"] = True
        fields["max_position_embeddings"] = hf["max_position_embeddings"] - _position_offset(hf, model_type)
    return ErnieConfig(**fields)


def head_from_hf(hf: Mapping[str, Any], tensor_names: set[str]) -> str:
    """The head from ``architectures``; without them, from the tensors (an MLM head, a classifier
    with a pooler -> sentence classifier, without -> token classifier, else the bare encoder)."""
    head = head_from_architectures(hf, HEAD_SUFFIXES)
    if head is not None:
        return head
    names = {n.removeprefix(ROOTS[hf["model_type"]]) for n in tensor_names}
    if any(n.startswith(("cls.predictions.", "lm_head.")) for n in names):
        return "masked_lm"
    if not any(n.startswith("classifier.") for n in names):
        return "none"
    pooled = "pooler.dense.weight" in names or "classifier.dense.weight" in names
    return "sequence_classification" if pooled else "token_classification"


def _has_pooler(config: ErnieConfig, head: str) -> bool:
    return head == "none" or (head == "sequence_classification" and config.classifier_pooling == "cls")


def _model_type(config: ErnieConfig) -> str:
    if config.pre_norm:
        return "roberta-prelayernorm"
    return "ernie" if config.task_type_vocab_size else "bert"


def tensor_from_hf(name: str, tensor: Any, config: ErnieConfig, head: str) -> list[tuple[str, Any]]:
    """One HF tensor under sampan's name; parts of a checkpoint the head has no use for (a
    pretraining checkpoint's pooler and MLM head, loaded as a token classifier) are skipped."""
    model_type = _model_type(config)
    name = name.removeprefix(ROOTS[model_type])
    if IGNORED.fullmatch(name):
        return []
    encoder_prefix = "" if head == "none" else "ernie."
    if name in SPECIAL_TENSORS:
        ours = SPECIAL_TENSORS[name]
    else:
        module, _, param = name.rpartition(".")
        param = PARAM_RENAMES.get(param, param)
        ours = None
        if module in HEAD_MODULES[model_type]:
            ours = f"{HEAD_MODULES[model_type][module]}.{param}"
        else:
            for pattern, target in _ENCODER_PATTERNS["pre" if config.pre_norm else "post"]:
                match = pattern.fullmatch(module)
                if match:
                    ours = encoder_prefix + target.format(**match.groupdict()) + f".{param}"
                    break
        if ours is None:
            raise KeyError(name)
    # Keep only what this head holds.
    if ours.startswith("lm_head.") and head != "masked_lm":
        return []
    if ours.startswith("classifier.") and head not in ("sequence_classification", "token_classification"):
        return []
    if ours.removeprefix(encoder_prefix).startswith("pooler.") and not _has_pooler(config, head):
        return []
    if ours.startswith("ernie.pooler.") and head == "none":
        ours = ours.removeprefix("ernie.")
    offset = _position_offset(config, model_type)
    if offset and ours.endswith("embeddings.position_embeddings.weight"):
        tensor = tensor[offset:]
    return [(ours, tensor)]


def _check_exportable(config: ErnieConfig, head: str) -> None:
    problems = []
    features = [f for f in ("pinyin", "radical", "stroke") if getattr(config, f"{f}_vocab_size")]
    if features:
        problems.append(f"it embeds {', '.join(features)} features, which HF BERT / ERNIE / RoBERTa have no "
                        "slot for")
    if head == "sequence_classification" and config.classifier_pooling != "cls":
        problems.append("classifier_pooling='mean' has no HF counterpart (HF classifiers read the [CLS] token)")
    if config.pre_norm and config.task_type_vocab_size:
        problems.append("a pre-norm ERNIE with task types has no HF counterpart")
    if config.pre_norm and config.pad_token_id is None:
        problems.append("a pre-norm ERNIE exports as pre-LayerNorm RoBERTa, which needs a pad_token_id")
    if config.pre_norm and head == "masked_lm" and config.activation != "gelu":
        problems.append("pre-LayerNorm RoBERTa's MLM head always uses gelu")
    if problems:
        raise ValueError("this ERNIE cannot be saved in Hugging Face format: " + "; ".join(problems))


def config_to_hf(config: ErnieConfig, head: str) -> dict[str, Any]:
    """The HF ``config.json``: ``bert`` for post-norm, ``ernie`` with task types, ``roberta-prelayernorm``
    for pre-norm."""
    _check_exportable(config, head)
    model_type = _model_type(config)
    hf: dict[str, Any] = {theirs: getattr(config, ours) for theirs, ours in CONFIG_FIELDS.items()}
    hf.update({
        "model_type": model_type,
        "architectures": [CLASS_PREFIX[model_type] + HEAD_ARCHITECTURE[head]],
        "hidden_act": ACTIVATIONS_TO_HF[config.activation],
        # HF always has a token-type table; a model without one gets a single zero row.
        "type_vocab_size": max(config.type_vocab_size, 1),
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "id2label": {str(i): f"LABEL_{i}" for i in range(config.num_labels)},
        "label2id": {f"LABEL_{i}": i for i in range(config.num_labels)},
    })
    if model_type == "ernie":
        hf.update({"use_task_id": True, "task_type_vocab_size": config.task_type_vocab_size})
    if model_type == "roberta-prelayernorm":
        hf["max_position_embeddings"] = config.max_position_embeddings + _position_offset(config, model_type)
        hf.update({"bos_token_id": None, "eos_token_id": None})
    return hf


def state_to_hf(state: Mapping[str, Any], config: ErnieConfig, head: str) -> dict[str, Any]:
    """sampan's state dict under the HF names of :func:`config_to_hf`'s architecture."""
    import torch  # here, not at the top: reading a config (sampan plan) must not import torch

    model_type = _model_type(config)
    roberta = model_type == "roberta-prelayernorm"
    encoder = {ours: hf for hf, ours in (PRE_NORM_MODULES if config.pre_norm else POST_NORM_MODULES).items()}
    heads = {ours: hf for hf, ours in HEAD_MODULES[model_type].items() if hf not in ("classifier", "classifier.out_proj")}
    heads["classifier"] = "classifier.out_proj" if roberta and head == "sequence_classification" else "classifier"
    decoder_bias = "lm_head.bias" if roberta else "cls.predictions.bias"
    root, encoder_prefix = ("", "") if head == "none" else (ROOTS[model_type], "ernie.")
    offset = _position_offset(config, model_type)
    out: dict[str, Any] = {}
    for name, tensor in state.items():
        module, _, param = name.rpartition(".")
        if name == "lm_head.decoder.bias":
            out[decoder_bias] = tensor
        elif module in heads:
            out[f"{heads[module]}.{param}"] = tensor
        else:
            local = module.removeprefix(encoder_prefix)
            layer = re.match(r"layers\.(\d+)\.", local)
            generic = f"layers.{{i}}.{local[layer.end():]}" if layer else local
            if generic not in encoder:
                raise ValueError(f"no Hugging Face name for sampan tensor {name}")
            if offset and generic == "embeddings.position_embeddings":
                tensor = torch.cat([tensor.new_zeros(offset, tensor.shape[1]), tensor])
            out[f"{root}{encoder[generic].format(i=layer.group(1) if layer else '')}.{param}"] = tensor
    if not config.type_vocab_size:  # HF always adds a token-type row; a zero one changes nothing
        word = state[f"{encoder_prefix}embeddings.word_embeddings.weight"]
        out[f"{root}embeddings.token_type_embeddings.weight"] = word.new_zeros(1, config.hidden_size)
    return out

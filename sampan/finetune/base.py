"""The base model a fine-tune starts from, and its weights carried into a task model.

A base directory is what ``sampan pretrain`` writes (an ``ErnieForMaskedLM``: config.json,
model.safetensors, tokenizer.json, features.json) or any sampan ERNIE model directory (a bare
encoder, or an earlier task model). The encoder weights are copied by name; the task head is
new. ``sampan.models.from_pretrained`` is strict on purpose (a saved model must load whole), so
the partial load a head swap needs lives here and says exactly what it took, dropped and
initialised.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from sampan.models.ernie.config import ErnieConfig
from sampan.models.pretrained import CONFIG_NAME, WEIGHTS_NAME, read_config
from sampan.models.weight_files import iter_tensors
from sampan.text.features import FEATURE_NAMES, CharFeatures
from sampan.text.tokenizer import PAD_ID, ChineseTokenizer

HEADS = {"sentiment_analysis": "sequence_classification", "ner": "token_classification"}
# Parameters that belong to a task head rather than the shared encoder.
HEAD_PREFIXES = ("classifier.", "ernie.pooler.")


@dataclasses.dataclass
class BaseModel:
    """What a fine-tune starts from.

    Fields:
        config: the base ERNIE config (its ``num_labels`` is replaced per task).
        tokenizer: the base's tokenizer (or one trained on the task's training split).
        directory: the base model directory, or None for a random-init config name.
        features: the character-feature table when the base embeds pinyin / radical / strokes.
        feature_names: which features the config enables (their ``*_vocab_size`` > 0).
        weights: the base's tensors (fp32), by name in the task model's naming; None for random init.
        name: what ``FinetuneConfig.model`` said.
    """

    config: ErnieConfig
    tokenizer: ChineseTokenizer
    directory: Path | None
    features: CharFeatures | None
    feature_names: tuple[str, ...]
    weights: dict[str, torch.Tensor] | None
    name: str


@dataclasses.dataclass
class LoadReport:
    """How the base weights went into the task model."""

    loaded: list[str]
    initialised: list[str]  # in the task model, not in the base (the new head)
    dropped: list[str]  # in the base, not used (the MLM head)

    def __str__(self) -> str:
        def names(xs: list[str]) -> str:
            return ", ".join(xs[:8]) + (f" (+{len(xs) - 8} more)" if len(xs) > 8 else "") if xs else "none"

        return (f"loaded {len(self.loaded)} base tensors; newly initialised: {names(self.initialised)}; "
                f"not used: {names(self.dropped)}")


def _ernie_config(data: dict, where: str) -> ErnieConfig:
    arch = data.pop("architecture", "")
    if not str(arch).startswith("Ernie"):
        raise ValueError(f"{where} holds a {arch or 'model of unknown architecture'}; fine-tuning for "
                         "sentiment_analysis / ner needs an ERNIE encoder (e.g. `sampan pretrain` output)")
    return ErnieConfig.from_dict(data), str(arch)


def _stored_model(model: str) -> Path:
    """The store's directory for ``model``, or an error naming all three kinds of name a base can be."""
    from sampan.models import list_models
    from sampan.store.models import RECIPE_NAMES, ModelNotFoundError, resolve

    try:
        return resolve(model)
    except ModelNotFoundError:
        if model in RECIPE_NAMES:  # a recipe not built yet: the store's error says how to build it
            raise
        from sampan.store.models import list_models as stored_models
        from sampan.utils.names import did_you_mean

        configs = [n for n in list_models() if n.startswith("ernie")]
        bases = [card.name for card in stored_models() if card.task == "fill_mask"]  # pretrained encoders
        hint = did_you_mean(model, bases + configs)
        raise FileNotFoundError(
            f"model {model!r} is neither a directory, a stored model (`sampan hub list`) nor a registered config "
            f"name; {hint}give a `sampan pretrain` output directory, a store name such as ernie-tiny-zh, or one "
            f"of: {', '.join(configs)} (random weights)") from None


def load_base(model: str, train_texts: Iterable[str] | None = None, vocab_size: int = 8000) -> BaseModel:
    """Resolve ``model`` (a directory, a model-store name or a registered ERNIE config name) into a ``BaseModel``.

    A store name (``sampan hub list``, e.g. ``ernie-tiny-zh``) is the stored model's directory. A
    config name (``ernie-tiny``) gets random weights (a warning says so) and a tokenizer trained on
    ``train_texts``.
    """
    from sampan.models import get_config, list_models

    path = Path(model)
    if not path.is_dir() and model not in list_models():
        path = _stored_model(model)
    if path.is_dir():
        data = read_config(path)
        config, arch = _ernie_config(dict(data), str(path / CONFIG_NAME))
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise FileNotFoundError(f"{tok_file} not found: a base model directory must hold the tokenizer it was "
                                    "trained with (`sampan pretrain` copies the data build's tokenizer.json)")
        tokenizer = ChineseTokenizer.load(tok_file)
        if tokenizer.vocab_size > config.vocab_size:
            raise ValueError(f"{tok_file} has {tokenizer.vocab_size} tokens but the model's vocab_size is "
                             f"{config.vocab_size}: they do not belong together")
        names = tuple(n for n in FEATURE_NAMES if getattr(config, f"{n}_vocab_size") > 0)
        features = None
        if names:
            feat_file = path / "features.json"
            if not feat_file.is_file():
                raise FileNotFoundError(f"{path} embeds {list(names)} features but has no features.json")
            features = CharFeatures.load(feat_file)
        weights_file = path / WEIGHTS_NAME
        if not weights_file.is_file():
            raise FileNotFoundError(f"{weights_file} not found (a base directory holds config.json + "
                                    "model.safetensors from save_pretrained)")
        raw = dict(iter_tensors([weights_file]))  # dequantizes an int8-stored base
        prefix = "ernie." if arch == "ErnieModel" else ""  # a bare encoder's names lack the task models' prefix
        weights = {prefix + k: (v.float() if v.is_floating_point() else v) for k, v in raw.items()}
        return BaseModel(config, tokenizer, path, features, names, weights, model)
    if train_texts is None:
        raise ValueError(f"{model!r} is a config name: training a tokenizer for it needs the training texts")
    tokenizer = ChineseTokenizer.train(train_texts, vocab_size=vocab_size)
    config = get_config(model, vocab_size=tokenizer.vocab_size, pad_token_id=PAD_ID)
    if not isinstance(config, ErnieConfig):
        raise ValueError(f"{model!r} is a {config.model_type} config; sentiment_analysis / ner fine-tune ERNIE")
    warnings.warn(f"model {model!r} is a config name, not a pretrained directory: fine-tuning starts from RANDOM "
                  "weights (expect much lower scores than from a `sampan pretrain` base)", stacklevel=3)
    return BaseModel(config, tokenizer, None, None, (), None, model)


def build_task_model(base: BaseModel, task: str, num_labels: int, seed: int, max_length: int,
                     overrides: dict[str, Any] | None = None):
    """The task model (sequence / token classification) with the base encoder's weights; ``(model, report)``.

    ``overrides`` replaces fields of the base's config (dropout, ``classifier_pooling``) that
    change no tensor shape. The head is initialised under ``seed``. A base tensor for a head parameter of another shape
    (a different label count) is re-initialised; any other mismatch or missing encoder tensor is
    an error naming it.
    """
    from sampan.models import create

    if task not in HEADS:
        raise ValueError(f"unknown task {task!r}; tasks: {list(HEADS)}")
    if max_length > base.config.max_position_embeddings:
        raise ValueError(f"max_length {max_length} exceeds the model's max_position_embeddings "
                         f"({base.config.max_position_embeddings}); lower max_length")
    config = base.config.replace(num_labels=num_labels, **(overrides or {}))
    torch.manual_seed(seed)
    model = create(config, head=HEADS[task])
    if base.weights is None:
        return model, LoadReport([], sorted(model.state_dict()), [])
    own = model.state_dict()
    loaded, initialised = [], []
    with torch.no_grad():
        for name, target in own.items():
            source = base.weights.get(name)
            is_head = name.startswith(HEAD_PREFIXES)
            if source is None or source.shape != target.shape:
                if is_head:
                    initialised.append(name)
                    continue
                problem = "missing" if source is None else f"of shape {tuple(source.shape)}, expected {tuple(target.shape)}"
                raise ValueError(f"base model {base.name}: encoder tensor {name} is {problem}; the base is not an "
                                 "ERNIE encoder of this shape")
            target.copy_(source)
            loaded.append(name)
    dropped = sorted(set(base.weights) - set(loaded))
    return model, LoadReport(loaded, initialised, dropped)

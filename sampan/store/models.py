"""The local model store (imports only ``sampan.utils``): named model directories, shipped in the package or built under ``$SAMPAN_HOME``.

A stored model is a directory holding ``config.json`` + ``model.safetensors`` (written by
``save_pretrained``; shipped models are fp16 to keep the package small) or, for a task model kept
as a delta over its base (LoRA / adapter weights, or the unfrozen tensors of a full fine-tune),
``task.json`` + ``adapter.safetensors`` pointing at its base, plus ``tokenizer.json``
and a ``card.json`` that says what it is, how it was built (the ``sampan hub build`` recipe and
seed) and what it scored. Lookup order: ``$SAMPAN_HOME/models/NAME`` (what the user built or
rebuilt) before ``sampan/hub/models/NAME`` (what ships), so a rebuild overrides the shipped copy.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sampan.store.model_dir import ModelDir
from sampan.utils.paths import user_models_dir

# The shipped models are package data under sampan/hub/models (where `sampan hub build` recipes
# made them); only their files are read from there, nothing is imported.
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "hub" / "models"
CARD_NAME = "card.json"
# The names `sampan hub build` has a recipe for. The store owns the names so that an unbuilt one
# gets the command that builds it without the store importing the recipes (a layer above it);
# tests/test_hub.py checks that sampan.hub.recipes registers exactly these.
RECIPE_NAMES = ("ernie-tiny-zh", "ernie-mini-zh", "gpt-zh", "ernie-tiny-sentiment", "ernie-mini-sentiment",
                "ernie-tiny-ner", "chat-zh-tiny", "ocr-det-zh", "ocr-rec-zh", "layout-det-zh")


def search_paths() -> list[Path]:
    """Model directories in lookup order: the user's builds, then the shipped models."""
    return [user_models_dir(), SHIPPED_DIR]


@dataclass
class ModelCard:
    """What ``card.json`` says about a stored model.

    Fields:
        name: the store name (``ernie-tiny-zh``).
        task: the task it serves ("fill_mask", "sentiment_analysis", "ner", "text_generation").
        description: one line for ``hub.list()``.
        recipe: the ``sampan hub build`` recipe that made it.
        base: the store name of the model it was fine-tuned from, if any.
        metrics: figures measured by the recipe on held-out data.
        settings: the recipe's settings (steps, seed, ...), so the build can be repeated.
        path: where it was found (filled in by the store, not saved).
    """

    name: str
    task: str
    description: str = ""
    recipe: str = ""
    base: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "path"}
        return data

    @classmethod
    def read(cls, directory: Path) -> ModelCard:
        data = json.loads((directory / CARD_NAME).read_text(encoding="utf-8"))
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "path"}
        return cls(**known, path=directory)


class ModelNotFoundError(FileNotFoundError):
    """A model name the store does not hold; the message names the command that builds it."""


def _is_model_dir(path: Path) -> bool:
    return path.is_dir() and (path / CARD_NAME).is_file()


def resolve(name: str) -> Path:
    """The directory of stored model ``name`` (a store name, or a path to a model directory)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a model name must be a non-empty string, got {name!r}")
    as_path = Path(name).expanduser()
    if os.sep in name or name.startswith("."):
        if as_path.is_dir():
            return as_path.resolve()
        raise ModelNotFoundError(f"model directory {name} does not exist")
    for root in search_paths():
        if _is_model_dir(root / name):
            return (root / name).resolve()
    known = sorted({c.name for c in list_models()} | set(RECIPE_NAMES))
    if name in RECIPE_NAMES:
        raise ModelNotFoundError(
            f"model {name!r} is not built yet; build it with `sampan hub build {name}` "
            f"(writes {user_models_dir() / name})")
    from sampan.utils.names import did_you_mean

    raise ModelNotFoundError(f"unknown model {name!r}; {did_you_mean(name, known)}known models: {', '.join(known)}")


def model_file(directory: str | os.PathLike[str], name: str) -> Path | None:
    """File ``name`` of a model directory, or of its base when the directory is an adapter layout
    (``task.json``'s ``base_model_dir``: a delta over a base keeps no tokenizer, config or
    features of its own); None when none in the chain has it. ``ModelDir(directory).file(name)``."""
    return ModelDir(Path(directory)).file(name)


def list_models() -> list[ModelCard]:
    """Every stored model, the user's builds first; a name in both places is listed once (the user's)."""
    cards: dict[str, ModelCard] = {}
    for root in search_paths():
        if not root.is_dir():
            continue
        for child in sorted(root.iterdir()):
            if _is_model_dir(child) and child.name not in cards:
                cards[child.name] = ModelCard.read(child)
    return list(cards.values())

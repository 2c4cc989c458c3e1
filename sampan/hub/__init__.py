"""``sampan.hub``: the local model store and PaddleHub-style modules.

::

    import sampan.hub as hub
    hub.list()                                  # stored models and modules
    module = hub.Module(name="ernie_gen")
    module.generate(text="人工智能的发展趋势")

Models ship inside the package (``sampan/hub/models``, fp16 safetensors) and can be rebuilt or
extended under ``$SAMPAN_HOME/models`` (default ``~/.sampan``) with ``sampan hub build NAME``,
which runs the same seeded recipe that made the shipped copy. Nothing is downloaded.
"""

from __future__ import annotations

from typing import Any

from sampan.hub.module import MODULES, Module
from sampan.store.models import ModelCard, ModelNotFoundError, list_models, resolve
from sampan.utils.paths import home


def list() -> dict[str, Any]:  # noqa: A001 - PaddleHub's name, kept on purpose
    """``{"models": [card dicts with path], "modules": {name: summary}}``."""
    models = [{**card.to_json(), "path": str(card.path)} for card in list_models()]
    return {"models": models, "modules": {name: spec.summary for name, spec in sorted(MODULES.items())}}


def build(name: str, settings: list[str] | None = None, **kwargs: Any):
    """Run the recipe for store model ``name`` (see ``sampan.hub.recipes``)."""
    from sampan.hub.recipes import build as _build

    return _build(name, settings, **kwargs)


__all__ = ["Module", "ModelCard", "ModelNotFoundError", "build", "home", "list", "resolve"]

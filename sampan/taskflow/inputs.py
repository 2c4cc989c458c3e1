"""What a Taskflow accepts, checked before any model runs, with errors that name the bad item."""

from __future__ import annotations

from collections.abc import Sequence


def check_texts(inputs: object, max_inputs: int | None = None) -> list[str]:
    """A string or a list / tuple of strings -> a list of strings.

    Raises ``ValueError`` (never a crash deep inside a model) for ``None``, a non-string item, an
    empty or whitespace-only text, an empty list, or more than ``max_inputs`` texts; the message
    names the index of the bad item and what to send instead.
    """
    if isinstance(inputs, str):
        items: Sequence[object] = [inputs]
    elif isinstance(inputs, (list, tuple)):
        items = inputs
    elif inputs is None:
        raise ValueError("Taskflow input is None: pass a string or a list of strings")
    else:
        raise ValueError(f"Taskflow input must be a string or a list of strings, got {type(inputs).__name__}")
    if not items:
        raise ValueError("Taskflow input is an empty list: pass at least one text")
    if max_inputs is not None and len(items) > max_inputs:
        raise ValueError(f"Taskflow input has {len(items)} texts, more than the limit of {max_inputs}; "
                         "split it into smaller lists")
    texts = []
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise ValueError(f"Taskflow input [{i}] is a {type(item).__name__}, not a string")
        if not item.strip():
            raise ValueError(f"Taskflow input [{i}] is empty: every text needs at least one non-space character")
        texts.append(item)
    return texts


def check_images(inputs: object, limits) -> tuple[bool, list]:
    """One image or a list / tuple of them -> ``(single, RGB uint8 arrays)``, each decoded by
    ``sampan.vision.image_input.load_image`` under ``limits`` (an ``ImageLimits``); errors name the
    bad item (``image [i]``)."""
    from sampan.vision.image_input import load_image

    single = not isinstance(inputs, (list, tuple))
    items = [inputs] if single else list(inputs)
    if not items:
        raise ValueError("Taskflow input is an empty list: pass at least one image")
    return single, [load_image(item, limits, "the image" if single else f"image [{i}]") for i, item in enumerate(items)]


def model_directory(name: str, buildable: tuple[str, ...], unbuilt: str):
    """A store name or a model directory -> the directory. A name in ``buildable`` that is not built
    yet raises ``FileNotFoundError`` with ``unbuilt`` (formatted with ``name``: how to build it)."""
    from pathlib import Path

    from sampan.store.models import ModelNotFoundError, resolve

    path = Path(name).expanduser()
    if path.is_dir():
        return path.resolve()
    try:
        return resolve(name)
    except ModelNotFoundError:
        if name not in buildable:
            raise
    raise FileNotFoundError(unbuilt.format(name=name))

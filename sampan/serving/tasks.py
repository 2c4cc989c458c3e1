"""Served tasks: a ``Taskflow`` (or any callable with its contract) behind a batched call.

The contract a task object keeps (``sampan.taskflow.Taskflow`` does): ``task(list_of_str)``
returns one JSON-serialisable dict per text, in order, and raises ``ValueError`` naming the index
and the problem for a bad input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sampan.serving.errors import ServingError

TaskCallable = Callable[[list[str]], list[dict]]


@dataclass
class ServedTask:
    """One task: its name, the object that runs it, and what ``GET /v1/tasks`` says about it."""

    name: str
    task: TaskCallable
    info: dict[str, Any] = field(default_factory=dict)

    def run_batch(self, payloads: Sequence[list[str]]) -> list[list[dict]]:
        """One model call for the texts of all requests in the batch, split back per request."""
        texts = [text for payload in payloads for text in payload]
        outputs = list(self.task(texts))
        if len(outputs) != len(texts):
            raise RuntimeError(f"task '{self.name}' returned {len(outputs)} results for {len(texts)} texts")
        split, start = [], 0
        for payload in payloads:
            split.append(outputs[start:start + len(payload)])
            start += len(payload)
        return split


# What the service sets for every task it loads, and the flag that sets it.
_SET_BY_SERVE = {"batch_size": "--max-batch-size", "num_threads": "--num-threads", "device": "--device"}


def check_task(name: str, options: dict[str, Any] | None = None, device: str = "auto") -> None:
    """A ``ValueError`` for an unknown task (closest name suggested), for an option the task does
    not take, for one the service sets itself, and a ``DeviceError`` for a GPU ``device`` its
    backend cannot use here; loads nothing, so ``sampan serve`` runs it on every task before any
    model loads."""
    from sampan.inference.device import predictor_device
    from sampan.taskflow.registry import task_class

    cls = task_class(name)
    for key in options or {}:
        if key in _SET_BY_SERVE:
            raise ValueError(f"task option {name}.{key}: sampan serve sets it for every task; use "
                             f"{_SET_BY_SERVE[key]}")
    cls.check_options(options or {})
    if cls.uses_predictor:
        predictor_device(device, str((options or {}).get("backend", "onnxruntime")))


def load_task(name: str, batch_size: int, options: dict[str, Any] | None = None,
              num_threads: int | None = None, device: str = "auto") -> ServedTask:
    """Build ``Taskflow(name, batch_size=..., device=...)`` after :func:`check_task`."""
    from sampan.taskflow import Taskflow

    check_task(name, options, device)
    known = Taskflow.tasks()
    options = dict(options or {})
    if num_threads is not None:
        options.setdefault("num_threads", num_threads)
    task = Taskflow(name, batch_size=batch_size, device=device, **options)
    info = dict(known[name])
    return ServedTask(name, task, info)


def validate_texts(inputs: list[str], *, max_inputs: int, max_chars: int) -> None:
    """Reject an empty list, empty / blank texts, too many texts and too-long texts with a 4xx."""
    if not inputs:
        raise ServingError(422, "empty_input", '"inputs" is an empty list; send at least one text, '
                                               'e.g. {"inputs": ["今天天气真好"]}')
    if len(inputs) > max_inputs:
        raise ServingError(413, "too_many_inputs", f'"inputs" has {len(inputs)} texts, more than the limit of '
                                                   f"{max_inputs} per request (max_inputs_per_request); "
                                                   "split it into several requests")
    for i, text in enumerate(inputs):
        if not text.strip():
            raise ServingError(422, "empty_input", f"inputs[{i}] is empty or only whitespace; send some text")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate from a "\ud800" JSON escape: not text
            raise ServingError(422, "invalid_text", f"inputs[{i}] is not valid Unicode ({err.reason} at "
                                                    f"character {err.start}); send UTF-8 text") from None
        if len(text) > max_chars:
            raise ServingError(413, "text_too_long", f"inputs[{i}] has {len(text)} characters, more than the "
                                                     f"limit of {max_chars} (max_text_chars); shorten it")


# -- images (/v1/tasks/ocr, /v1/tasks/layout, /v1/tasks/document) ------------------------------------
OCR_TASK = "ocr"
LAYOUT_TASK = "layout"
DOCUMENT_TASK = "document"
IMAGE_TASKS = (OCR_TASK, LAYOUT_TASK, DOCUMENT_TASK)  # tasks whose inputs are uploaded images
_OCR_EXAMPLE = ('send JSON {"inputs": ["<base64 of the image file>"]} with Content-Type: application/json, or the '
                "image file itself with Content-Type: image/png (image/jpeg, ...)")


def parse_image_request(content_type: str, body: bytes, limits: Any, task: str = OCR_TASK) -> list:
    """The decoded RGB images of one ``/v1/tasks/{task}`` request for an image task (``IMAGE_TASKS``),
    or a 4xx ``ServingError``.

    Two forms: the JSON every task endpoint takes, ``{"inputs": [...]}``, each input a base64 image
    file (a ``data:image/...;base64,`` URL too); or one image file as the raw body under an
    ``image/*`` (or ``application/octet-stream``) Content-Type. ``limits`` is the running
    ``ServingConfig``: ``max_images_per_request`` and ``max_image_pixels`` (from the header, before
    decoding) are checked here; ``max_image_bytes`` already bounded the body.
    """
    import base64
    import binascii
    import json

    from sampan.serving.errors import _is_json_media_type

    media = content_type.split(";")[0].strip().lower()
    if _is_json_media_type(content_type):
        if not body:
            raise ServingError(422, "empty_body", f"the request body is empty; {_OCR_EXAMPLE}")
        try:
            payload = json.loads(body)
        except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ServingError(400, "invalid_json", f"the request body is not valid JSON ({str(err)[:160]}); "
                                                    f"{_OCR_EXAMPLE}") from None
        if not isinstance(payload, dict) or set(payload) != {"inputs"} or not isinstance(payload["inputs"], list):
            keys = sorted(payload)[:5] if isinstance(payload, dict) else type(payload).__name__
            raise ServingError(422, "invalid_request", f'the body must be {{"inputs": [base64 images]}}, got {keys}; '
                                                       f"{_OCR_EXAMPLE}")
        items = payload["inputs"]
        _check_count(len(items), limits)
        files = []
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise ServingError(422, "invalid_request", f"inputs[{i}] is a {type(item).__name__}, not a base64 "
                                                           "string of an image file")
            text = item.strip()
            if text.startswith("data:"):
                head, _, text = text.partition(",")
                if ";base64" not in head:
                    raise ServingError(422, "invalid_image", f"inputs[{i}] is a data: URL without ;base64")
            try:
                files.append(base64.b64decode(text, validate=True))
            except (binascii.Error, ValueError):
                raise ServingError(422, "invalid_image", f"inputs[{i}] is not valid base64: encode the image "
                                                         "file's bytes (e.g. `base64 -w0 page.png`)") from None
    elif media.startswith("image/") or media == "application/octet-stream":
        if not body:
            raise ServingError(422, "empty_body", f"the request body is empty; {_OCR_EXAMPLE}")
        files = [body]
    else:
        sent = f"Content-Type {content_type!r}" if content_type.strip() else "a request with no Content-Type"
        raise ServingError(415, "unsupported_media_type", f"/v1/tasks/{task} does not take {sent}; {_OCR_EXAMPLE}")
    return [_decode(data, i, limits) for i, data in enumerate(files)]


def _check_count(count: int, limits: Any) -> None:
    if count == 0:
        raise ServingError(422, "empty_input", f'"inputs" is an empty list; {_OCR_EXAMPLE}')
    if count > limits.max_images_per_request:
        raise ServingError(413, "too_many_inputs", f'"inputs" has {count} images, more than the limit of '
                                                   f"{limits.max_images_per_request} per request "
                                                   "(max_images_per_request); send them in several requests")


def _decode(data: bytes, index: int, limits: Any):
    from sampan.vision.image_input import ImageInputError, ImageLimits, load_image

    try:
        return load_image(data, ImageLimits(max_pixels=limits.max_image_pixels), f"inputs[{index}]")
    except ImageInputError as err:
        if err.reason == "too_large":
            raise ServingError(413, "image_too_large", str(err).replace("(max_pixels)", "(max_image_pixels)")) from None
        raise ServingError(422, "invalid_image", str(err)) from None

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

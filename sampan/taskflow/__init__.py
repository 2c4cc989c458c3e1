"""``Taskflow``: AI in one line, for people who are not ML engineers.

::

    from sampan import Taskflow
    sentiment_analysis = Taskflow("sentiment_analysis")
    sentiment_analysis("这家餐厅的服务非常棒")
    # [{'text': '这家餐厅的服务非常棒', 'label': 'positive', 'score': 0.97}]

Each task runs a model from the local store (``sampan.hub``; shipped models need no download)
through the inference predictor on its exported graph (ONNX Runtime), not the eager model, on a
GPU when there is one it can use (``device=``). The first use of a model exports it once to
``$SAMPAN_HOME/cache``.

Inputs: a string or a list of strings (batched by ``batch_size``). ``None``, a non-string, an
empty text or an empty list raise ``ValueError`` naming the bad item; a text longer than
``max_length`` tokens is truncated with a warning (``ner`` instead tags it window by window, so
every character is covered).
"""

from __future__ import annotations

from typing import Any

from sampan.taskflow.registry import TASKS, task_class
from sampan.taskflow.task import Task


class Taskflow:
    """``Taskflow(task, model=None, **options)``: a callable that runs ``task`` on texts.

    Args:
        task: a task name from ``Taskflow.tasks()``.
        model: a store model name (``sampan.hub.list()``) or model directory; default: the task's.
        task_path: PaddleNLP's name for a fine-tuned model directory; the same as ``model=``.
        batch_size: texts per model call.
        max_length: tokens per text the model sees (``[CLS]`` / ``[SEP]`` included).
        precision: "fp32" or "int8" (ONNX Runtime dynamic quantization; smaller, faster on small CPUs).
        num_threads: ONNX Runtime intra-op threads (default: the cores this process may use).
        backend: "onnxruntime" (default) or "torch" (the exported ``.pt2`` program).
        device: "auto" (default: a GPU when the backend can use one, else the CPU), "cpu", "cuda"
            or "cuda:N". On ONNX Runtime a GPU needs the ``onnxruntime-gpu`` wheel, so with the
            plain ``onnxruntime`` "auto" is the CPU; on ``backend="torch"`` it is the GPU torch
            sees. A GPU asked for and not usable is a ``DeviceError`` (a ``ValueError``) naming
            the fix, raised before the model is exported; ``.task.loaded.predictor.device`` says
            where it runs. word_segmentation (jieba, no model) runs on the CPU whatever it says.
        **options: task options, e.g. ``max_new_tokens``, ``temperature``, ``top_k``, ``seed`` for
            generation; ``line_chars`` / ``lines`` for poetry; ``top_k`` for fill_mask. An option
            the task does not read is a ``ValueError`` naming it and the task's options.
    """

    def __init__(self, task: str, model: str | None = None, *, task_path: str | None = None, **options: Any):
        cls = task_class(task)
        if task_path is not None:
            if model is not None and str(model) != str(task_path):
                raise ValueError(f"model={model!r} and task_path={task_path!r} name two models; pass one")
            model = str(task_path)
        self.task_name = task
        self.task: Task = cls(model=model, **options)

    def __call__(self, inputs: Any) -> list[dict[str, Any]]:
        return self.task(inputs)

    @staticmethod
    def tasks() -> dict[str, dict[str, Any]]:
        """``{task: {"description", "default_model", "models"}}`` for every task."""
        return {name: {"description": cls.description, "default_model": cls.default_model,
                       "models": list(cls.models)} for name, cls in sorted(TASKS.items())}

    def __repr__(self) -> str:
        return f"Taskflow({self.task_name!r}, model={self.task.model_name!r})"


__all__ = ["Task", "Taskflow"]

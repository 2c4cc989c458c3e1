"""``Task``: the preprocess -> run -> postprocess skeleton every Taskflow task fills in."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from sampan.taskflow.inputs import check_texts

# What every task takes besides its own ``option_names``: ``Task.__init__``'s parameters, and
# ``task_path``, which ``Taskflow`` turns into ``model``.
COMMON_ARGUMENTS = ("model", "task_path", "batch_size", "max_length", "precision", "num_threads", "backend",
                    "device")


class Task:
    """One task on one model. Subclasses set the class fields and implement the three steps.

    Class fields:
        name: the task name (``"sentiment_analysis"``).
        description: one line for ``Taskflow.tasks()``.
        default_model: the store model used when none is named.
        models: the store models this task can run.

    ``__call__`` validates the input (``check_texts``), cuts it into batches of ``batch_size`` and
    runs ``_preprocess`` -> ``_run_model`` -> ``_postprocess`` on each, returning one dict per text.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    default_model: ClassVar[str] = ""
    models: ClassVar[tuple[str, ...]] = ()
    # The task options a subclass reads from ``self.options``; any other keyword is refused, so a
    # misspelt option (``temprature=0.5``) is an error instead of a silently ignored setting.
    option_names: ClassVar[tuple[str, ...]] = ()
    # Whether the task runs a model through the predictor (and so on ``device``); jieba's
    # word_segmentation does not, so a GPU asked for is no reason for it to fail.
    uses_predictor: ClassVar[bool] = True

    def __init__(self, model: str | None = None, batch_size: int = 32, max_length: int = 128,
                 precision: str = "fp32", num_threads: int | None = None, backend: str = "onnxruntime",
                 device: str = "auto", **kwargs: Any):
        self.check_options(kwargs)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not isinstance(max_length, int) or max_length < 8:
            raise ValueError(f"max_length must be an integer >= 8, got {max_length!r}")
        self.model_name = model or self.default_model
        self.batch_size = batch_size
        self.max_length = max_length
        self.precision = precision
        self.num_threads = num_threads
        self.backend = backend
        from sampan.utils.device import check_device_spec

        self.device = check_device_spec(device)  # the spelling now; the hardware in _load
        self.options = kwargs
        self._construct_model(self.model_name)

    @classmethod
    def check_options(cls, options: Iterable[str]) -> None:
        """A ``ValueError`` naming each of ``options`` (keyword names) that is neither one of the
        task's ``option_names`` nor an argument every task takes, with the closest known name.
        ``sampan serve`` calls it on ``--task-option`` before it loads any model."""
        unknown = sorted(set(options) - set(cls.option_names) - set(COMMON_ARGUMENTS))
        if not unknown:
            return
        from sampan.utils.names import did_you_mean

        known = [*COMMON_ARGUMENTS, *cls.option_names]
        hints = "".join(f"; for {name!r}, {hint.strip()}" for name in unknown if (hint := did_you_mean(name, known)))
        own = ", ".join(cls.option_names) if cls.option_names else "none"
        raise ValueError(f"{cls.name} does not take {', '.join(map(repr, unknown))}{hints} "
                         f"(its options: {own}; every task takes {', '.join(COMMON_ARGUMENTS)})")

    # -- the three steps (and model construction) that a task implements ------------------------
    def _construct_model(self, model: str) -> None:
        raise NotImplementedError

    def _preprocess(self, texts: list[str]) -> Any:
        raise NotImplementedError

    def _run_model(self, inputs: Any) -> Any:
        raise NotImplementedError

    def _postprocess(self, texts: list[str], inputs: Any, outputs: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _load(self, model: str):
        """The stored ``model`` exported (once) and opened on ``self.device``."""
        from sampan.inference.device import predictor_device
        from sampan.taskflow.runtime import load

        # Before the export, which is slow on a first use: a GPU this backend cannot use is a
        # DeviceError now, naming the fix. A task with no model (word_segmentation) never asks.
        predictor_device(self.device, self.backend)

        return load(model, precision=self.precision, num_threads=self.num_threads, backend=self.backend,
                    device=self.device)

    # -- the loop --------------------------------------------------------------------------------
    def __call__(self, inputs: Any) -> list[dict[str, Any]]:
        texts = check_texts(inputs)
        results: list[dict[str, Any]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start: start + self.batch_size]
            prepared = self._preprocess(batch)
            results.extend(self._postprocess(batch, prepared, self._run_model(prepared)))
        return results

    def __repr__(self) -> str:
        return f"{type(self).__name__}(task={self.name!r}, model={self.model_name!r}, batch_size={self.batch_size})"

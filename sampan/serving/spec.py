"""``ServeSpec``: what one ``sampan serve`` serves, where, and how (its flags are generated from it).

The spec is checked before any model loads (a bad task name or a missing model directory fails at
once, not in every one of ``--workers N`` worker processes that uvicorn would restart forever),
and with several workers it reaches each one as JSON through the environment
(:func:`app_from_env`, uvicorn's app factory).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Literal

from sampan.serving.config import ServingConfig
from sampan.utils.config import build, nested, resolve_nested, to_dict
from sampan.utils.flags import REPEAT

ENV = "SAMPAN_SERVE_SPEC"  # how --workers N hands the spec to each uvicorn worker process


@dataclasses.dataclass
class ServeSpec:
    """What to serve, on which device, in how many processes, within which limits.

    Fields:
        tasks: Taskflow tasks served at POST /v1/tasks/TASK (--task, repeatable), e.g.
            sentiment_analysis, ner, word_segmentation, text_generation, poetry_generation, fill_mask.
        model_dirs: exported model folders (DIR/inference.json + .onnx, from sampan.jit.save) served
            at POST /v1/models/NAME/predict, as NAME=DIR (--model-dir, repeatable); a bare DIR is
            named after its folder.
        chat_model: a generating model served through OpenAI's API (/v1/chat/completions,
            /v1/completions, /v1/models) with continuous batching (--model): a sampan model
            directory, a Hugging Face one with its tokenizer and chat template, or a store name
            (sampan hub list). Tasks and exported models can be served beside it.
        served_model_name: the model id clients send and /v1/models lists (default: the
            directory's or store name's last part).
        task_options: a Taskflow keyword for one task, TASK.KEY=VALUE, e.g.
            text_generation.max_new_tokens=32 (--task-option, repeatable).
        device: where the tasks and exported models run: auto (a GPU when the backend can use one,
            else the CPU), cpu, cuda (this worker's GPU: cuda:$LOCAL_RANK) or cuda:N. Exported models
            and the default tasks run on ONNX Runtime, which needs the onnxruntime-gpu wheel for a
            GPU (with plain onnxruntime, auto is the CPU and cuda an error); --task-option
            TASK.backend=torch runs a task's .pt2 on torch's GPU.
        num_threads: torch / onnxruntime threads per worker (default: the libraries' own choice).
        workers: uvicorn worker processes, each loading its own copy of every model (memory grows by
            one model set per worker; /metrics shows the worker that answered).
        log_level: uvicorn's log level.
        limits: batching, request limits and the address to bind (``ServingConfig``).
    """

    tasks: list[str] = dataclasses.field(default_factory=list, metadata={REPEAT: True})
    model_dirs: list[str] = dataclasses.field(default_factory=list, metadata={REPEAT: True})
    chat_model: str | None = None
    served_model_name: str | None = None
    task_options: list[str] = dataclasses.field(default_factory=list, metadata={REPEAT: True})
    device: str = "auto"
    num_threads: int | None = None
    workers: int = 1
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    limits: ServingConfig = nested(ServingConfig, flatten=True)

    def __post_init__(self) -> None:
        resolve_nested(self)
        from sampan.utils.device import check_device_spec

        self.tasks = list(dict.fromkeys(self.tasks))
        self.device = check_device_spec(self.device)
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"--num-threads must be >= 1, got {self.num_threads}")
        self.model_dir_map()  # the forms are checked now, before anything loads
        self.task_option_map()

    def model_dir_map(self) -> dict[str, str]:
        """``NAME=DIR`` (or a bare ``DIR``, named after its last folder) -> ``{name: dir}``."""
        out: dict[str, str] = {}
        for pair in self.model_dirs:
            name, sep, path = pair.partition("=")
            if not sep:
                name, path = Path(pair).resolve().name, pair
            if not name or not path:
                raise ValueError(f"--model-dir {pair!r} must look like NAME=DIR (e.g. cls=exported/cls)")
            if name in out:
                raise ValueError(f"--model-dir names {name!r} twice; give each model its own NAME")
            out[name] = path
        return out

    def task_option_map(self) -> dict[str, dict]:
        """``task.key=value`` pairs (values as YAML scalars) -> ``{task: {key: value}}``."""
        from sampan.utils.settings import load_yaml, split_assignment

        out: dict[str, dict] = {}
        for pair in self.task_options:
            key, value = split_assignment(pair, "--task-option", "text_generation.max_new_tokens=32")
            task, dot, name = key.partition(".")
            if not dot or not task or not name:
                raise ValueError(f"--task-option {pair!r} must look like TASK.KEY=VALUE "
                                 "(e.g. text_generation.max_new_tokens=32)")
            if task not in self.tasks:
                raise ValueError(f"--task-option {pair!r} is for task {task!r}, which is not served (--task {task})")
            out.setdefault(task, {})[name] = load_yaml(value)
        return out

    def check(self) -> None:
        """Fail at once, before any model loads, on what would fail later."""
        from sampan.inference.device import predictor_device
        from sampan.serving.tasks import check_task

        options = self.task_option_map()
        for task in self.tasks:
            check_task(task, options.get(task), self.device)
        for name, path in self.model_dir_map().items():
            if not (Path(path) / "inference.json").is_file():
                raise FileNotFoundError(f"model '{name}': {Path(path) / 'inference.json'} not found")
        if self.model_dirs:
            predictor_device(self.device, "onnxruntime")  # served models run their .onnx
        if self.chat_model is not None:
            from sampan.serving.chat_model import resolve_model_dir

            self.chat_model = str(resolve_model_dir(self.chat_model))  # a store name becomes its directory
            if not (Path(self.chat_model) / "tokenizer.json").is_file():
                raise FileNotFoundError(f"--model {self.chat_model}: no tokenizer.json there; the chat API needs the "
                                        "model's tokenizer (and chat template) beside its weights")
        if not self.tasks and not self.model_dirs and self.chat_model is None:
            raise ValueError("nothing to serve: give --task NAME, --model-dir NAME=DIR and/or --model DIR")

    def grace_seconds(self) -> int:
        """Seconds a shutdown waits for in-flight requests: none can outlive its own timeout."""
        return int(self.limits.request_timeout_s) + 5

    def build_app(self):
        """The FastAPI app serving this spec (loads every model)."""
        from sampan.serving.app import create_app

        if self.num_threads:
            import torch

            torch.set_num_threads(self.num_threads)
        return create_app(tasks=self.tasks, model_dirs=self.model_dir_map(), limits=self.limits,
                          task_options=self.task_option_map(), num_threads=self.num_threads, device=self.device,
                          chat_model=self.chat_model, chat_model_name=self.model_name())

    def model_name(self) -> str | None:
        """The chat model's id: --served-model-name, else the last part of what --model named."""
        if self.chat_model is None:
            return None
        return self.served_model_name or Path(self.chat_model).name

    def to_env(self) -> None:
        """Hand the spec to worker processes (``app_from_env``)."""
        os.environ[ENV] = json.dumps(to_dict(self))


def app_from_env():
    """The app factory each ``--workers N`` process calls (the spec comes through the environment)."""
    return build(ServeSpec, json.loads(os.environ[ENV])).build_app()


__all__ = ["ENV", "ServeSpec", "app_from_env"]

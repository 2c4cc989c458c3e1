"""``create_app``: the FastAPI application serving tasks and exported models.

Endpoints: ``POST /v1/tasks/{task}`` (``/v1/tasks/ocr``, ``/layout`` and ``/document`` take images), ``POST /v1/models/{name}/predict``, ``GET /v1/tasks``,
``GET /healthz``, ``GET /metrics`` (Prometheus), ``GET /openapi.json`` and the demo page at ``/``;
with a chat model also OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``
(``openai_api.py``, continuous batching in ``chat_engine.py``).
Models load when the app is created, so a bad task name or model folder fails at start-up, not on
the first request.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from starlette.concurrency import run_in_threadpool

from sampan.serving.batcher import DynamicBatcher
from sampan.serving.config import ServingConfig
from sampan.serving.errors import ServingError, install_error_handlers
from sampan.serving.metrics import ServingMetrics
from sampan.serving.middleware import LimitsAndMetricsMiddleware
from sampan.serving.models import ServedModel
from sampan.serving.schemas import (
    DocumentResponse,
    ErrorResponse,
    LayoutResponse,
    ModelRequest,
    ModelResponse,
    OcrRequest,
    OcrResponse,
    TaskRequest,
    TaskResponse,
)
from sampan.serving.tasks import (
    DOCUMENT_TASK,
    IMAGE_TASKS,
    LAYOUT_TASK,
    OCR_TASK,
    ServedTask,
    TaskCallable,
    load_task,
    parse_image_request,
    validate_texts,
)

log = logging.getLogger("sampan.serving")

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": why}
    for code, why in [(400, "malformed JSON"), (404, "unknown task or model"), (413, "a size limit exceeded"),
                      (422, "wrong types or empty input"), (503, "overloaded"), (504, "timed out")]}


def _page() -> str:
    return resources.files("sampan.serving").joinpath("static/index.html").read_text(encoding="utf-8")


def _as_served_tasks(tasks: Sequence[str] | Mapping[str, TaskCallable], limits: ServingConfig,
                     task_options: Mapping[str, dict] | None, num_threads: int | None,
                     device: str = "auto") -> dict[str, ServedTask]:
    if isinstance(tasks, Mapping):  # ready task objects (embedding, tests): used as given
        return {name: task if isinstance(task, ServedTask) else ServedTask(name, task, {"description": name})
                for name, task in tasks.items()}
    if isinstance(tasks, str):
        tasks = [tasks]
    served = {}
    for name in dict.fromkeys(tasks):  # in order, each once
        served[name] = load_task(name, limits.max_batch_size, (task_options or {}).get(name), num_threads, device)
    return served


def to_serving_error(error: BaseException, target: str) -> ServingError:
    """A model-side exception as the client sees it: ValueError = bad input (422), anything else 500."""
    if isinstance(error, ServingError):
        return error
    if isinstance(error, ValueError):
        return ServingError(422, "invalid_input", f"'{target}' rejected the input: {error}")
    log.error("'%s' failed: %s: %s", target, type(error).__name__, error)
    return ServingError(500, "model_error", f"'{target}' failed on this batch ({type(error).__name__}); "
                                            "it is logged and the service keeps running")


def create_app(tasks: Sequence[str] | Mapping[str, TaskCallable] = (), model_dirs: Mapping[str, str] | None = None,
               limits: ServingConfig | None = None, task_options: Mapping[str, dict] | None = None,
               num_threads: int | None = None, device: str = "auto", chat_model: Any = None,
               chat_model_name: str | None = None) -> FastAPI:
    """Build the service.

    Args:
        tasks: task names to load through ``Taskflow`` (e.g. ``["sentiment_analysis", "ner"]``), or a
            mapping from name to a ready task object (``texts -> list[dict]``).
        model_dirs: ``{name: dir}`` of exported models (``DIR/inference.{json,onnx}``), served at
            ``/v1/models/{name}/predict``.
        limits: batching, size limits and timeouts (:class:`ServingConfig`).
        task_options: extra ``Taskflow`` keyword arguments per task name (e.g. ``max_new_tokens``).
        num_threads: ONNX Runtime threads per task and exported model (default: one per core).
        device: where the loaded tasks and exported models run: "auto" (default: a GPU when
            their backend can use one, else the CPU), "cpu", "cuda" or "cuda:N". Inputs and
            outputs are host arrays either way; a GPU that cannot be used is a ``DeviceError``
            naming the fix, at start-up. Ready task objects are used as given.
        chat_model: a generating model served through OpenAI's API with continuous batching: a
            model directory (sampan or Hugging Face, with its tokenizer), a store name, or a
            loaded :class:`~sampan.serving.chat_model.ChatModel`.
        chat_model_name: the id clients send as ``model`` (default: the directory's name).
    """
    limits = limits or ServingConfig()
    served_tasks = _as_served_tasks(tasks, limits, task_options, num_threads, device)
    served_models = {name: ServedModel(name, path, num_threads, device) for name, path in (model_dirs or {}).items()}
    chat = _chat_model(chat_model, chat_model_name, device)
    if not served_tasks and not served_models and chat is None:
        raise ValueError("nothing to serve: give at least one task (--task sentiment_analysis), exported model "
                         "(--model-dir NAME=DIR) or chat model (--model DIR)")
    metrics = ServingMetrics()
    engine = _chat_engine(chat, limits, metrics) if chat is not None else None

    def batcher(name: str, fn: Any) -> DynamicBatcher:
        return DynamicBatcher(name, fn, max_batch_size=limits.max_batch_size, max_wait_ms=limits.max_wait_ms,
                              max_queue_inputs=limits.max_queue_inputs, metrics=metrics)

    task_batchers = {name: batcher(name, t.run_batch) for name, t in served_tasks.items()}
    model_batchers = {name: batcher(f"model:{name}", m.run_batch) for name, m in served_models.items()}
    all_batchers = [*task_batchers.values(), *model_batchers.values()]

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        for b in all_batchers:
            await b.start()
        if engine is not None:
            engine.start()
        yield
        for b in all_batchers:
            await b.stop()
        if engine is not None:
            engine.stop()

    app = FastAPI(title="sampan serving", version=_version(), lifespan=lifespan,
                  description="Sampan tasks and exported models over HTTP, with dynamic batching. Every error "
                              'is JSON: {"error": {"code": ..., "message": ...}}.',
                  # Swagger UI / ReDoc load their scripts from a CDN, which an offline deployment cannot
                  # reach; the schema itself is served at /openapi.json.
                  docs_url=None, redoc_url=None)
    app.state.limits = limits
    app.state.metrics = metrics
    app.state.batchers = {**task_batchers, **model_batchers}
    app.state.chat_engine = engine
    install_error_handlers(app)
    if chat is not None:
        from sampan.serving.openai_api import install_openai_routes

        assert engine is not None
        engine.start()  # also for ASGI hosts that skip the lifespan (test clients); start is idempotent
        install_openai_routes(app, chat, engine, limits)

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(_page())

    @app.get("/healthz", summary="liveness: 200 while the service answers")
    async def healthz() -> dict:
        return {"status": "ok", "tasks": list(served_tasks), "models": list(served_models),
                "chat_model": chat.name if chat is not None else None, "pid": os.getpid()}

    @app.get("/v1/tasks", summary="the served tasks and models, and the limits in force")
    async def list_tasks() -> dict:
        return {"tasks": {n: t.info for n, t in served_tasks.items()},
                "models": {n: m.info() for n, m in served_models.items()},
                "chat_model": chat.info() if chat is not None else None,
                "limits": limits.to_dict()}

    def image_route(name: str, response_model: Any, summary: str) -> None:
        # Before /v1/tasks/{task}, which it overrides: images come as base64 JSON (the shape every task
        # endpoint and the demo page's fetch send) or as the raw file (curl --data-binary, no multipart
        # parser needed); decoded on a worker thread, not the event loop.
        @app.post(f"/v1/tasks/{name}", response_model=response_model, responses=_ERRORS, summary=summary,
                  name=f"run_{name}",
                  openapi_extra={"requestBody": {"required": True, "content": {
                      "application/json": {"schema": OcrRequest.model_json_schema()},
                      "image/*": {"schema": {"type": "string", "format": "binary"}}}}})
        async def run_images(request: Request) -> dict:
            body = await request.body()
            images = await run_in_threadpool(parse_image_request, request.headers.get("content-type", ""), body,
                                             limits, name)
            try:
                outputs = await task_batchers[name].submit(images, len(images), limits.request_timeout_s)
            except Exception as error:  # noqa: BLE001 - mapped to a 4xx / 5xx JSON answer
                raise to_serving_error(error, name) from None
            return {"task": name, "outputs": outputs}

    for name, response_model, summary in (
            (OCR_TASK, OcrResponse, "read the text lines of images (base64 JSON, or one image file as the body)"),
            (LAYOUT_TASK, LayoutResponse, "find the layout regions of page images, in reading order (base64 JSON, "
                                          "or one image file as the body)"),
            (DOCUMENT_TASK, DocumentResponse, "turn page images into Markdown (layout + OCR; base64 JSON, or one "
                                              "image file as the body)")):
        if name in served_tasks:
            image_route(name, response_model, summary)

    @app.post("/v1/tasks/{task}", response_model=TaskResponse, responses=_ERRORS,
              summary="run a task on a list of texts (dynamically batched with concurrent requests)")
    async def run_task(task: str, body: TaskRequest) -> dict:
        if task not in served_tasks:
            raise ServingError(404, "unknown_task", f"task {task!r} is not served here; served tasks: "
                                                    f"{sorted(served_tasks) or 'none'} (start with --task NAME)")
        validate_texts(body.inputs, max_inputs=limits.max_inputs_per_request, max_chars=limits.max_text_chars)
        try:
            outputs = await task_batchers[task].submit(body.inputs, len(body.inputs), limits.request_timeout_s)
        except Exception as error:  # noqa: BLE001 - mapped to a 4xx / 5xx JSON answer
            raise to_serving_error(error, task) from None
        return {"task": task, "outputs": outputs}

    @app.post("/v1/models/{name}/predict", response_model=ModelResponse, responses=_ERRORS,
              summary="run an exported model on named input arrays (dynamically batched)")
    async def predict(name: str, body: ModelRequest) -> dict:
        if name not in served_models:
            raise ServingError(404, "unknown_model", f"model {name!r} is not served here; served models: "
                                                     f"{sorted(served_models) or 'none'} (start with --model-dir "
                                                     "NAME=DIR)")
        request = served_models[name].parse(body.inputs, limits.max_inputs_per_request)
        try:
            outputs = await model_batchers[name].submit(request, request.rows, limits.request_timeout_s)
        except Exception as error:  # noqa: BLE001 - mapped to a 4xx / 5xx JSON answer
            raise to_serving_error(error, name) from None
        return {"model": name, "outputs": outputs}

    @app.get("/metrics", summary="Prometheus metrics (text exposition format)")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    app.add_middleware(LimitsAndMetricsMiddleware, max_body_bytes=limits.max_body_bytes, metrics=metrics,
                       path_limits={f"/v1/tasks/{name}": (limits.max_image_bytes, "max_image_bytes")
                                    for name in IMAGE_TASKS})
    return app


def _chat_model(chat_model: Any, name: str | None, device: str) -> Any:
    if chat_model is None:
        return None
    from sampan.serving.chat_model import ChatModel

    if isinstance(chat_model, ChatModel):
        return chat_model
    return ChatModel(chat_model, name=name, device=device)


def _chat_engine(chat: Any, limits: ServingConfig, metrics: ServingMetrics) -> Any:
    from sampan.serving.chat_engine import ChatEngine

    def record(running: int, waiting: int) -> None:
        metrics.chat_sequences.labels("running").set(running)
        metrics.chat_sequences.labels("waiting").set(waiting)

    def step(rows: int, seconds: float) -> None:
        metrics.batch_size.labels("chat").observe(rows)
        metrics.batch_latency.labels("chat").observe(seconds)

    return ChatEngine(chat.model, chat.tokenizer, chat.num_layers, chat.eos_ids, chat.pad_id,
                      max_running=limits.chat_max_running, max_waiting=limits.chat_max_waiting, on_change=record,
                      on_step=step)


def _version() -> str:
    from sampan._version import __version__

    return __version__

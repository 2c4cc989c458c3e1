"""``sampan serve``: Taskflow tasks and exported models over HTTP; flags from ``sampan.serving.spec.ServeSpec``."""

from __future__ import annotations

import argparse
import sys

from sampan.commands import arguments_later, set_handler


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.serving.spec import ServeSpec  # the serving package's config only: no FastAPI yet
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(parser, ServeSpec, flags={"tasks": ("--task",), "model_dirs": ("--model-dir",),
                                                 "task_options": ("--task-option",), "chat_model": ("--model",)},
                       metavars={"tasks": "TASK", "model_dirs": "NAME=DIR", "task_options": "TASK.KEY=VALUE",
                                 "chat_model": "DIR"})


def run(args: argparse.Namespace) -> int:
    """Load the models, bind, serve until interrupted."""
    import uvicorn

    from sampan.serving.spec import ServeSpec
    from sampan.utils.flags import dataclass_from_args

    spec = dataclass_from_args(ServeSpec, args)
    if spec.chat_model is not None and spec.served_model_name is None:
        spec.served_model_name = spec.model_name()  # a store name's, before check() turns it into a path
    spec.check()  # task names, options and model folders, before anything loads
    limits = spec.limits
    where = f"http://{limits.host}:{limits.port}"
    common = dict(host=limits.host, port=limits.port, log_level=spec.log_level, access_log=False,
                  timeout_graceful_shutdown=spec.grace_seconds())
    models = list(spec.model_dir_map())
    if spec.workers == 1:
        app = spec.build_app()
        chat = f" chat model {spec.served_model_name!r}" if spec.chat_model else ""
        print(f"sampan serve: tasks {spec.tasks} models {models}{chat} on device {spec.device} "
              f"at {where} (page {where}/, schema {where}/openapi.json)", file=sys.stderr, flush=True)
        uvicorn.run(app, **common)
        return 0
    spec.to_env()
    print(f"sampan serve: {spec.workers} worker processes, each loading tasks {spec.tasks} models {models}, at "
          f"{where}", file=sys.stderr, flush=True)
    uvicorn.run("sampan.serving.spec:app_from_env", factory=True, workers=spec.workers, **common)
    return 0


def register(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve", help="serve Taskflow tasks, exported models and a chat model (OpenAI API) over HTTP",
        description="Start an HTTP service (FastAPI + uvicorn): POST /v1/tasks/TASK {\"inputs\": [texts]}, "
                    "POST /v1/models/NAME/predict, GET /v1/tasks, /healthz, /metrics (Prometheus), /openapi.json, "
                    "and a demo page at /. Concurrent requests are batched up to --max-batch-size / --max-wait-ms. "
                    "--model DIR adds OpenAI's /v1/chat/completions, /v1/completions and /v1/models for a "
                    "generating model, with continuous batching and streaming. "
                    "Binds to 127.0.0.1 unless --host says otherwise. Details: docs/serving.md.",
        epilog="examples:  sampan serve --task sentiment_analysis --task ner --task text_generation --port 8866\n"
               "           sampan serve --model Qwen2.5-0.5B-Instruct/ --chat-max-running 16",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    arguments_later(serve, _arguments)
    set_handler(serve, run)

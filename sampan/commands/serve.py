"""``sampan serve``: Taskflow tasks and exported models over HTTP (flags and run in ``sampan.serving.command``)."""

from __future__ import annotations

import argparse

from sampan.commands import arguments_later, set_handler


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.serving.command import add_arguments  # imports FastAPI (~1 s): only for this verb

    add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from sampan.serving.command import run

    return run(args)


def register(subparsers) -> None:
    serve = subparsers.add_parser(
        "serve", help="serve Taskflow tasks and exported models over HTTP (dynamic batching, demo page at /)",
        description="Start an HTTP service (FastAPI + uvicorn): POST /v1/tasks/TASK {\"inputs\": [texts]}, "
                    "POST /v1/models/NAME/predict, GET /v1/tasks, /healthz, /metrics (Prometheus), /openapi.json, "
                    "and a demo page at /. Concurrent requests are batched up to --max-batch-size / --max-wait-ms. "
                    "Binds to 127.0.0.1 unless --host says otherwise. Details: docs/serving.md.",
        epilog="example:  sampan serve --task sentiment_analysis --task ner --task text_generation --port 8866")
    arguments_later(serve, _arguments)
    set_handler(serve, run)

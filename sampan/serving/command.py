"""``sampan serve``: arguments and the run function (imported lazily by ``sampan.commands.serve``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from sampan.serving.config import ServingConfig

_ENV = "SAMPAN_SERVE_SPEC"  # how --workers N hands the app's settings to each uvicorn worker process

_HELP = {
    "max_batch_size": "most inputs per batched model call; 1 turns dynamic batching off",
    "max_wait_ms": "how long a batch waits for more requests before it runs",
    "max_body_bytes": "largest request body, in bytes (413 above)",
    "max_inputs_per_request": "most texts / rows in one request (413 above)",
    "max_text_chars": "longest text, in characters (413 above)",
    "request_timeout_s": "seconds a request may wait for its result (504 after)",
    "max_queue_inputs": "inputs allowed to wait per task / model (503 above)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``serve`` verb's flags: what to serve, where, how many workers, and every ServingConfig limit."""
    parser.add_argument("--task", action="append", default=[], metavar="TASK",
                        help="a Taskflow task to serve at POST /v1/tasks/TASK (repeatable), e.g. sentiment_analysis, "
                             "ner, word_segmentation, text_generation, poetry_generation, fill_mask")
    parser.add_argument("--model-dir", action="append", default=[], metavar="NAME=DIR",
                        help="an exported model folder (DIR/inference.json + .onnx, from sampan.jit.save) served at "
                             "POST /v1/models/NAME/predict (repeatable); a bare DIR is named after its folder")
    parser.add_argument("--task-option", action="append", default=[], metavar="TASK.KEY=VALUE",
                        help="a Taskflow keyword for one task, e.g. text_generation.max_new_tokens=32 (repeatable)")
    defaults = ServingConfig()
    parser.add_argument("--host", default=defaults.host,
                        help=f"address to bind (default: {defaults.host}, loopback only; 0.0.0.0 exposes the "
                             "service to the network)")
    parser.add_argument("--port", type=int, default=defaults.port, help=f"TCP port (default: {defaults.port})")
    parser.add_argument("--workers", type=int, default=1,
                        help="uvicorn worker processes, each loading its own copy of every model (memory grows "
                             "by one model set per worker; /metrics shows the worker that answered) (default: 1)")
    parser.add_argument("--device", default="auto",
                        help="where the tasks and exported models run: auto (a GPU when the backend can use one, "
                             "else the CPU), cpu, cuda (this worker's GPU: cuda:$LOCAL_RANK) or cuda:N. Exported "
                             "models and the default tasks run on ONNX Runtime, which needs the onnxruntime-gpu "
                             "wheel for a GPU (with plain onnxruntime, auto is the CPU and cuda an error); "
                             "--task-option TASK.backend=torch runs a task's .pt2 on torch's GPU (default: auto)")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="torch / onnxruntime threads per worker (default: the libraries' own choice)")
    for field in dataclasses.fields(ServingConfig):
        if field.name in ("host", "port"):
            continue
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(field.default), default=field.default,
                            help=f"{_HELP.get(field.name, '')} (default: {field.default!r})")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="uvicorn log level (default: info)")


def parse_model_dirs(pairs: list[str]) -> dict[str, str]:
    """``NAME=DIR`` (or a bare ``DIR``, named after its last folder) -> ``{name: dir}``."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep:
            name, path = Path(pair).resolve().name, pair
        if not name or not path:
            raise ValueError(f"--model-dir {pair!r} must look like NAME=DIR (e.g. cls=exported/cls)")
        if name in out:
            raise ValueError(f"--model-dir names {name!r} twice; give each model its own NAME")
        out[name] = path
    return out


def parse_task_options(pairs: list[str], tasks: list[str]) -> dict[str, dict]:
    """``task.key=value`` pairs (values as YAML scalars) -> ``{task: {key: value}}``."""
    from sampan.utils.settings import load_yaml, split_assignment

    out: dict[str, dict] = {}
    for pair in pairs:
        key, value = split_assignment(pair, "--task-option", "text_generation.max_new_tokens=32")
        task, dot, name = key.partition(".")
        if not dot or not task or not name:
            raise ValueError(f"--task-option {pair!r} must look like TASK.KEY=VALUE "
                             "(e.g. text_generation.max_new_tokens=32)")
        if task not in tasks:
            raise ValueError(f"--task-option {pair!r} is for task {task!r}, which is not served (--task {task})")
        out.setdefault(task, {})[name] = load_yaml(value)
    return out


def _spec(args: argparse.Namespace) -> dict:
    limits = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServingConfig)}
    return {"tasks": list(dict.fromkeys(args.task)), "model_dirs": parse_model_dirs(args.model_dir),
            "task_options": parse_task_options(args.task_option, args.task), "limits": limits,
            "num_threads": args.num_threads, "device": args.device}


def _build(spec: dict):
    from sampan.serving.app import create_app

    if spec["num_threads"]:
        import torch

        torch.set_num_threads(spec["num_threads"])
    return create_app(tasks=spec["tasks"], model_dirs=spec["model_dirs"], limits=ServingConfig(**spec["limits"]),
                      task_options=spec["task_options"], num_threads=spec["num_threads"],
                      device=spec.get("device", "auto"))


def app_from_env():
    """The app factory each ``--workers N`` process calls (settings come through the environment)."""
    return _build(json.loads(os.environ[_ENV]))


def _check_before_loading(spec: dict) -> None:
    """Fail at once, before any model loads, on what would fail later (with ``--workers N``, make
    every worker die at start and be restarted forever)."""
    from sampan.inference.device import predictor_device
    from sampan.serving.tasks import check_task

    for task in spec["tasks"]:
        check_task(task, spec["task_options"].get(task), spec["device"])
    for name, path in spec["model_dirs"].items():
        if not (Path(path) / "inference.json").is_file():
            raise FileNotFoundError(f"model '{name}': {Path(path) / 'inference.json'} not found")
    if spec["model_dirs"]:
        predictor_device(spec["device"], "onnxruntime")  # served models run their .onnx
    if not spec["tasks"] and not spec["model_dirs"]:
        raise ValueError("nothing to serve: give --task NAME and/or --model-dir NAME=DIR")


def _grace(spec: dict) -> int:
    """Seconds a shutdown waits for in-flight requests: none can outlive its own timeout."""
    return int(spec["limits"]["request_timeout_s"]) + 5


def run(args: argparse.Namespace) -> int:
    """Load the models, bind, serve until interrupted."""
    import uvicorn

    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    spec = _spec(args)
    ServingConfig(**spec["limits"])  # validate the limits before loading anything
    _check_before_loading(spec)  # task names and options too
    where = f"http://{args.host}:{args.port}"
    if args.workers == 1:
        app = _build(spec)
        print(f"sampan serve: tasks {spec['tasks']} models {list(spec['model_dirs'])} on device {args.device} "
              f"at {where} (page {where}/, schema {where}/openapi.json)", file=sys.stderr, flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False,
                    timeout_graceful_shutdown=_grace(spec))
        return 0
    os.environ[_ENV] = json.dumps(spec)
    print(f"sampan serve: {args.workers} worker processes, each loading tasks {spec['tasks']} models "
          f"{list(spec['model_dirs'])}, at {where}", file=sys.stderr, flush=True)
    uvicorn.run("sampan.serving.command:app_from_env", factory=True, host=args.host, port=args.port,
                workers=args.workers, log_level=args.log_level, access_log=False,
                timeout_graceful_shutdown=_grace(spec))
    return 0

"""``sampan task``: a Taskflow task on texts from the shell (``sampan.taskflow``)."""

from __future__ import annotations

import argparse
import json
import sys

from sampan.commands import set_handler


def parse_options(pairs: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` task options (values read as YAML scalars: ``seed=3`` is an int, ``0.7`` a
    float) -> ``{key: value}``; the task itself refuses a key it does not take."""
    from sampan.utils.settings import parse_assignments

    return parse_assignments(pairs, "--option", "max_new_tokens=32")


# Taskflow keywords that have their own flag here, and the flag.
_FLAGS = {"model": "--model", "batch_size": "--batch-size", "max_length": "--max-length",
          "precision": "--precision", "device": "--device"}


def run(args: argparse.Namespace) -> int:
    if not args.task and not args.list:
        raise ValueError("name a task (sampan task --list shows them)")
    from sampan.taskflow import Taskflow

    if args.list:
        print(json.dumps(Taskflow.tasks(), ensure_ascii=False, indent=2))
        return 0
    options = parse_options(args.option)
    for key, flag in _FLAGS.items():  # given twice, Taskflow would get the keyword twice (a TypeError)
        if key in options:
            raise ValueError(f"--option {key}=...: sampan task has a flag for it; use {flag}")
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    flow = Taskflow(args.task, model=args.model, batch_size=args.batch_size, max_length=args.max_length,
                    precision=args.precision, device=args.device, **options)
    for result in flow(texts):
        print(json.dumps(result, ensure_ascii=False))
    return 0


def register(subparsers) -> None:
    task = subparsers.add_parser("task", help="run a Taskflow task on texts (arguments or stdin lines)",
                                 description="Run a task through the inference predictor and print one JSON line "
                                             "per text, e.g. sampan task sentiment_analysis 这家餐厅的服务非常棒",
                                 epilog="tasks: sentiment_analysis, ner, word_segmentation, text_generation, "
                                        "poetry_generation, fill_mask. Example: sampan task poetry_generation 春 "
                                        "--option line_chars=5 --option seed=1")
    task.add_argument("task", nargs="?", help="task name")
    task.add_argument("text", nargs="*", help="texts (default: read lines from stdin)")
    task.add_argument("--model", default=None, help="a store model name or directory (default: the task's)")
    task.add_argument("--batch-size", type=int, default=32, help="(default: 32)")
    task.add_argument("--max-length", type=int, default=128,
                      help="tokens per text the model sees; longer ones are truncated with a warning "
                           "(ner tags them window by window) (default: 128)")
    task.add_argument("--precision", choices=("fp32", "int8"), default="fp32", help="(default: fp32)")
    task.add_argument("--device", default="auto",
                      help="where the model runs: auto (a GPU when the backend can use one, else the CPU), cpu, "
                           "cuda or cuda:N. The tasks run on ONNX Runtime, which needs the onnxruntime-gpu wheel "
                           "for a GPU (with plain onnxruntime, auto is the CPU and cuda an error naming the fix); "
                           "--option backend=torch runs the .pt2 on the GPU torch sees (default: auto)")
    task.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                      help="a task option, repeatable: max_new_tokens, min_new_tokens, temperature, top_k, "
                           "repetition_penalty, seed (generation); line_chars, lines (poetry); top_k (fill_mask)")
    task.add_argument("--list", action="store_true", help="list tasks and their models")
    set_handler(task, run)

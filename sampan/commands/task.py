"""``sampan task``: a Taskflow task on texts from the shell (``sampan.taskflow``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Literal

from sampan.commands import set_handler
from sampan.utils.flags import REPEAT, SWITCH


@dataclasses.dataclass
class TaskOptions:
    """Which task, on which texts, with which model and options.

    Fields:
        task: task name (sampan task --list shows them).
        texts: texts (default: read lines from stdin); for ocr, image files (one JSON line each:
            {"image": PATH, "lines": [{"text", "score", "box"}, ...]}); for layout, image files ({"image":
            PATH, "regions": [{"label", "score", "box"}, ...]}); for document, image files (their Markdown,
            pages separated by a blank line: sampan task document page.png > page.md).
        model: a store model name or directory (default: the task's).
        batch_size: texts per model call.
        max_length: tokens per text the model sees; longer ones are truncated with a warning (ner
            tags them window by window).
        precision: fp32, or int8 (ONNX Runtime dynamic quantization).
        device: where the model runs: auto (a GPU when the backend can use one, else the CPU), cpu,
            cuda or cuda:N. The tasks run on ONNX Runtime, which needs the onnxruntime-gpu wheel
            for a GPU (with plain onnxruntime, auto is the CPU and cuda an error naming the fix);
            --option backend=torch runs the .pt2 on the GPU torch sees.
        options: a task option, KEY=VALUE (repeatable): max_new_tokens, min_new_tokens,
            temperature, top_k, repetition_penalty, seed (generation); line_chars, lines
            (poetry); top_k (fill_mask); det_model, rec_model, box_thresh, drop_score, max_pixels (ocr);
            score_threshold, iou_threshold (layout).
        list_tasks: list the tasks and their models (--list).
    """

    task: str | None = None
    texts: list[str] = dataclasses.field(default_factory=list)
    model: str | None = None
    batch_size: int = 32
    max_length: int = 128
    precision: Literal["fp32", "int8"] = "fp32"
    device: str = "auto"
    options: list[str] = dataclasses.field(default_factory=list, metadata={REPEAT: True})
    list_tasks: bool = dataclasses.field(default=False, metadata={SWITCH: True})


def parse_options(pairs: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` task options (values read as YAML scalars: ``seed=3`` is an int, ``0.7`` a
    float) -> ``{key: value}``; the task itself refuses a key it does not take."""
    from sampan.utils.settings import parse_assignments

    return parse_assignments(pairs, "--option", "max_new_tokens=32")


# Taskflow keywords that have their own flag here, and the flag.
_FLAGS = {"model": "--model", "batch_size": "--batch-size", "max_length": "--max-length",
          "precision": "--precision", "device": "--device"}


def run(args: argparse.Namespace) -> int:
    from sampan.utils.flags import dataclass_from_args

    cfg = dataclass_from_args(TaskOptions, args)
    if not cfg.task and not cfg.list_tasks:
        raise ValueError("name a task (sampan task --list shows them)")
    from sampan.taskflow import Taskflow

    if cfg.list_tasks:
        print(json.dumps(Taskflow.tasks(), ensure_ascii=False, indent=2))
        return 0
    options = parse_options(cfg.options)
    for key, flag in _FLAGS.items():  # given twice, Taskflow would get the keyword twice (a TypeError)
        if key in options:
            raise ValueError(f"--option {key}=...: sampan task has a flag for it; use {flag}")
    texts = cfg.texts or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    flow = Taskflow(cfg.task, model=cfg.model, batch_size=cfg.batch_size, max_length=cfg.max_length,
                    precision=cfg.precision, device=cfg.device, **options)
    if getattr(flow.task, "takes_images", False):
        if not texts:
            raise ValueError(f"{cfg.task} reads images: name the image files, e.g. sampan task {cfg.task} page.png")
        results = flow(texts)
        if getattr(flow.task, "prints_markdown", False):  # document: the Markdown itself, `> page.md`
            for i, result in enumerate(results):
                sys.stdout.write(("\n" if i else "") + result["markdown"].rstrip("\n") + "\n")
            return 0
        key = getattr(flow.task, "result_key", "lines")  # ocr: "lines"; layout: "regions"
        for path, result in zip(texts, results, strict=True):
            print(json.dumps({"image": path, key: result}, ensure_ascii=False))
        return 0
    for result in flow(texts):
        print(json.dumps(result, ensure_ascii=False))
    return 0


def register(subparsers) -> None:
    task = subparsers.add_parser("task", help="run a Taskflow task on texts (arguments or stdin lines)",
                                 description="Run a task through the inference predictor and print one JSON line "
                                             "per text, e.g. sampan task sentiment_analysis 这家餐厅的服务非常棒",
                                 epilog="tasks: sentiment_analysis, ner, word_segmentation, text_generation, "
                                        "poetry_generation, fill_mask, ocr, layout and document (their arguments are image "
                                        "files). "
                                        "Examples: sampan task poetry_generation 春 --option line_chars=5 --option "
                                        "seed=1; sampan task ocr page.png scan.jpg; sampan task layout page.png; "
                                        "sampan task document page.png > page.md")
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(task, TaskOptions, positional={"task": "?", "texts": "*"}, flags={"options": ("--option",), "list_tasks": ("--list",)},
                       metavars={"texts": "TEXT", "options": "KEY=VALUE", "model": "NAME_OR_DIR"})
    set_handler(task, run)

"""``sampan pretrain``: ERNIE masked-LM pretraining on a data build (``sampan.pretraining``); flags
from ``PretrainConfig``, its ``training`` (``TrainingArguments``) included."""

from __future__ import annotations

import argparse
import json

from sampan.commands import arguments_later, set_handler


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.pretraining.config import PretrainConfig  # torch-free
    from sampan.trainer.arguments import RESUME_FLAG, TRAINING_ALIASES
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(parser, PretrainConfig, required=("data",),
                       aliases={**TRAINING_ALIASES, "model.name": ("--model",), "model.overrides": ("--override",),
                                "train_corpora": ("--corpora",)},
                       metavars={"features": "FEATURE[,FEATURE...]", "train_corpora": "CORPUS[,CORPUS...]",
                                 "model.name": "NAME"},
                       consts=RESUME_FLAG)


def run(args: argparse.Namespace) -> int:
    from sampan.pretraining import PretrainConfig, pretrain
    from sampan.trainer.report import plot_curves, summarize
    from sampan.utils.flags import dataclass_from_args

    config = dataclass_from_args(PretrainConfig, args)
    _, summary = pretrain(config)
    out = config.training.output_dir
    print(json.dumps({**summary, "report": str(plot_curves(out)), **summarize(out)}, indent=2))
    return 0


def register(subparsers) -> None:
    pre = subparsers.add_parser(
        "pretrain", help="pretrain ERNIE with knowledge masking on a data build (through the Trainer)",
        description="Masked-LM pretraining of an ERNIE model on `sampan data build` output. --masking knowledge "
                    "stages ERNIE 1.0's levels (char -> phrase -> entity); masked spans are whole units within a "
                    "15% token budget, replaced 80/10/10. Gets the Trainer's resume, TensorBoard, metrics.jsonl "
                    "and report; every TrainingArguments field is a --training.FIELD flag.",
        epilog="example:  sampan pretrain --model ernie-tiny --data data/pretrain --masking knowledge --steps 300 "
               "--training.lr_scheduler cosine")
    arguments_later(pre, _arguments)
    set_handler(pre, run)

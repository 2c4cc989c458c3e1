"""``sampan pretrain``: ERNIE masked-LM pretraining on a data build (``sampan.pretraining``)."""

from __future__ import annotations

import argparse
import json

from sampan.commands import arguments_later, set_handler


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.pretraining.config import PretrainConfig  # imports torch (the Trainer's arguments)
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(parser, PretrainConfig, exclude=("model_overrides",), required=("data",),
                       flags={"max_steps": ("--steps", "--max-steps")},
                       metavars={"features": "FEATURE[,FEATURE...]", "corpora": "CORPUS[,CORPUS...]"})
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="change a model config field, e.g. --override num_layers=2 (repeatable)")


def parse_model_overrides(pairs: list[str]) -> dict:
    """``key=value`` model-config overrides (values parsed as YAML scalars, as ``--set`` does)."""
    from sampan.utils.settings import parse_assignments

    return parse_assignments(pairs, "--override", "num_layers=2")


def run(args: argparse.Namespace) -> int:
    from sampan.pretraining import PretrainConfig, pretrain
    from sampan.trainer.report import plot_curves, summarize
    from sampan.utils.flags import dataclass_from_args

    config = dataclass_from_args(PretrainConfig, args, model_overrides=parse_model_overrides(args.override))
    _, summary = pretrain(config)
    png = plot_curves(config.output_dir)
    print(json.dumps({**summary, "report": str(png), **summarize(config.output_dir)}, indent=2))
    return 0


def register(subparsers) -> None:
    pre = subparsers.add_parser(
        "pretrain", help="pretrain ERNIE with knowledge masking on a data build (through the Trainer)",
        description="Masked-LM pretraining of an ERNIE model on `sampan data build` output. --masking knowledge "
                    "stages ERNIE 1.0's levels (char -> phrase -> entity); masked spans are whole units within a "
                    "15% token budget, replaced 80/10/10. Gets the Trainer's resume, TensorBoard, metrics.jsonl "
                    "and report.",
        epilog="example:  sampan pretrain --model ernie-tiny --data data/pretrain --masking knowledge --steps 300")
    arguments_later(pre, _arguments)
    set_handler(pre, run)

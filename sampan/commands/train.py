"""``sampan train``: train as a run file says (``sampan.runfile``); any of the file's values can be
changed from the command line (``--training.max_steps 50``, or ``--set training.max_steps=50``)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from sampan.commands import arguments_later, set_handler
from sampan.utils.config import nested
from sampan.utils.flags import Changes


@dataclasses.dataclass
class TrainOptions:
    """Which run file, and changes to it.

    Fields:
        config: the run file: TOML, YAML or JSON with [model] [data] [training] (and [strategy]) tables.
        changes: changes to the file's values (--set TABLE.KEY=VALUE).
    """

    config: str
    changes: Changes = nested(Changes, flatten=True)


def parse_overrides(pairs: list[str]) -> dict:
    """``table.key=value`` pairs; values are parsed as YAML scalars (numbers, bools, null, strings)."""
    from sampan.utils.settings import parse_assignments

    return parse_assignments(pairs, "--set", "training.max_steps=100", form="table.key=value")


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.runfile import RunConfig  # imports numpy only
    from sampan.trainer.arguments import TRAINING_ALIASES
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(parser, TrainOptions, metavars={"changes.set": "TABLE.KEY=VALUE", "config": "RUN_FILE"})
    # The run file's own fields, each a flag that changes the file's value (none given: the file as it is).
    add_dataclass_args(parser, RunConfig, overrides_only=True,
                       aliases={"training.device": ("--device",), "training.compile": ("--compile",)}
                       | {k: v for k, v in TRAINING_ALIASES.items() if k in ("training.max_steps",
                                                                              "training.output_dir")})


def run(args: argparse.Namespace) -> int:
    from sampan.runfile import RunConfig
    from sampan.runfile import run as run_training
    from sampan.trainer.report import plot_curves, summarize
    from sampan.utils.flags import dataclass_from_args, overrides_from_args

    options = dataclass_from_args(TrainOptions, args)
    # A flag of the run file's fields is a --set too; an explicit --set wins.
    overrides = overrides_from_args(RunConfig, args) | parse_overrides(options.changes.set)
    config = RunConfig.from_file(options.config, overrides)
    trainer, vocab = run_training(config)
    final = trainer.save_pretrained(f"{config.training.output_dir}/model")
    if not trainer.is_main:  # under `sampan launch`: rank 0 reports for the job
        return 0
    if vocab is not None:
        vocab.save(final / "vocab.json")
    png = plot_curves(config.training.output_dir)
    print(json.dumps({"model": str(final), "report": str(png), **summarize(config.training.output_dir)}, indent=2))
    return 0


def register(subparsers) -> None:
    train = subparsers.add_parser(
        "train", help="train from a run file (TOML / YAML / JSON: [model] [data] [training])",
        description="Train as a run file says. Tables: [model] (name + config overrides), [data] (corpus or "
                    "token_file, seq_len), [training] (TrainingArguments), [strategy] (DistributedStrategy). "
                    "Unknown keys are errors. Every field is also a flag that changes the file's value "
                    "(--training.max_steps 50, --data.seq_len 64, --model.overrides num_layers=2). Resume with "
                    "--training.resume_from_checkpoint auto.",
        epilog="example:  sampan train --config examples/configs/gpt_tiny_sanguo.toml --training.max_steps 50")
    arguments_later(train, _arguments)
    set_handler(train, run)

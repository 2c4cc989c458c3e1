"""``sampan report``: a run's loss / lr curves as a PNG and its summary."""

from __future__ import annotations

import argparse
import dataclasses
import json

from sampan.commands import set_handler
from sampan.utils.config import nested
from sampan.utils.output import Output


@dataclasses.dataclass
class ReportOptions:
    """Which run to report on, and where the plot goes.

    Fields:
        run_dir: a Trainer output directory (its metrics.jsonl).
        out: the PNG to write (default: RUN_DIR/report.png).
        output: how the summary is printed.
    """

    run_dir: str
    out: str | None = None
    output: Output = nested(Output, flatten=True)


def run(args: argparse.Namespace) -> int:
    from sampan.trainer.report import plot_curves, summarize
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(ReportOptions, args)
    summary = summarize(options.run_dir)
    png = plot_curves(options.run_dir, options.out)
    if options.output.json:
        print(json.dumps({"report": str(png), **summary}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run summary: {options.run_dir}")
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
        description="Read RUN_DIR/metrics.jsonl, write a PNG of the loss and learning-rate curves (default "
                    "RUN_DIR/report.png) and print a summary table.")
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(report, ReportOptions, positional={"run_dir": None}, metavars={"run_dir": "RUN_DIR",
                                                                                        "out": "PNG"})
    set_handler(report, run)

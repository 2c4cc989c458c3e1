"""``sampan hub list|build|evaluate``: the local model store and its recipes (``sampan.hub``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sampan.commands import set_handler


def run_list(args: argparse.Namespace) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    import sampan.hub as hub
    from sampan.hub.command import headline_metrics
    from sampan.hub.recipes import RECIPES

    listing = hub.list()
    if args.json:
        print(json.dumps(listing, ensure_ascii=False, indent=2))
        return 0
    home_models = hub.home() / "models"
    table = Table(title=f"sampan model store (built: {home_models}; shipped: sampan/hub/models)",
                  caption="every figure of every card: sampan hub list --json", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    # Names and figures are what a reader copies or compares, so they are never cut: the name
    # column does not wrap, and each figure gets its own line.
    table.add_column("name", no_wrap=True)
    table.add_column("task", no_wrap=True)
    table.add_column("held-out metrics", overflow="fold")
    table.add_column("where", no_wrap=True)
    stored = {m["name"] for m in listing["models"]}
    for m in listing["models"]:
        # "built" or "shipped" rather than the path, which the title gives and 80 columns cannot hold
        where = "built" if Path(m["path"]).is_relative_to(home_models) else "shipped"
        table.add_row(m["name"], m["task"], headline_metrics(m["metrics"], "\n", short=True), where)
    for name in sorted(set(RECIPES) - stored):
        table.add_row(name, RECIPES[name].task, "", f"not built: sampan hub build {name}")
    Console().print(table)
    modules = Table(title="hub.Module(name=...)", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    modules.add_column("module", no_wrap=True)
    modules.add_column("what it does")
    for name, summary in listing["modules"].items():
        modules.add_row(name, summary)
    Console().print(modules)
    return 0


def run_build(args: argparse.Namespace) -> int:
    from sampan.hub.recipes import build

    build(args.name, args.set, out_root=Path(args.out) if args.out else None)
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    if args.write and args.max_examples:
        raise ValueError("--write records whole-split figures; drop --max-examples")
    from sampan.hub.evaluate import evaluate_model, write_metrics

    metrics = evaluate_model(args.name, args.max_examples)
    print(json.dumps(metrics, ensure_ascii=False, indent=2))
    if args.write:
        print(f"wrote the figures to {write_metrics(args.name, metrics)}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    hub = subparsers.add_parser("hub", help="the local model store: list models, build them from recipes",
                                description="Models ship in the package and can be (re)built under "
                                            "$SAMPAN_HOME/models (default ~/.sampan) by the seeded recipes that "
                                            "made them.")
    actions = hub.add_subparsers(dest="hub_action", metavar="ACTION", required=True)
    lst = actions.add_parser("list", help="stored models with their held-out figures, and hub modules")
    lst.add_argument("--json", action="store_true", help="print JSON")
    set_handler(lst, run_list)
    build = actions.add_parser(
        "build", help="run a model's recipe (ernie-tiny-zh, gpt-zh, ernie-tiny-sentiment, ernie-tiny-ner)",
        description="Build a store model from corpora that ship in packages: ernie-tiny-zh (knowledge-masking "
                    "pretraining), gpt-zh (causal LM), ernie-tiny-sentiment / ernie-tiny-ner (fine-tuned from "
                    "ernie-tiny-zh, which must exist). Seeded: the same settings give the same model.",
        epilog="example:  sampan hub build ernie-tiny-sentiment --set steps=300 --set method=full")
    build.add_argument("name", help="the model to build")
    build.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="change a recipe setting (repeatable; see sampan/hub/recipes.py for the fields)")
    build.add_argument("--out", default="", help="store directory (default: $SAMPAN_HOME/models)")
    set_handler(build, run_build)
    evaluate = actions.add_parser(
        "evaluate", help="score a stored task model on its held-out test split again",
        description="Re-run a task model's test evaluation (sentiment accuracy, NER span P / R / F1) on the stored "
                    "weights, as its recipe does, e.g. after a change to how predictions are decoded.",
        epilog="example:  sampan hub evaluate ernie-tiny-ner --write")
    evaluate.add_argument("name", help="a store model name or directory")
    evaluate.add_argument("--max-examples", type=int, default=0, help="score only this many test examples (0 = all)")
    evaluate.add_argument("--write", action="store_true",
                          help="put the figures in the model's card.json and task.json (whole split only)")
    set_handler(evaluate, run_evaluate)

"""``sampan hub list|build|evaluate``: the local model store and its recipes (``sampan.hub``).

``sampan hub build NAME`` takes the recipe's settings as flags generated from its settings
dataclass (``sampan hub build gpt-zh --training.max_steps 300``), or as ``--set KEY=VALUE``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from sampan.commands import arguments_later, set_handler
from sampan.utils.config import nested
from sampan.utils.flags import Changes

# The figures a table row has room for: the scores, not their losses, supports or precision /
# recall parts (``--json`` prints every figure of every card).
_HEADLINE_SUFFIXES = ("f1", "accuracy", "perplexity")


@dataclasses.dataclass
class BuildOptions:
    """Where a recipe's model goes, and changes to its settings.

    Fields:
        out: the store directory (default: $SAMPAN_HOME/models).
        changes: changes to the recipe's settings (--set KEY=VALUE, the same as each setting's own flag).
    """

    out: str = ""
    changes: Changes = nested(Changes, flatten=True)


@dataclasses.dataclass
class EvaluateOptions:
    """Which stored task model to score again, and on how much.

    Fields:
        model_name: a store model name or directory.
        max_examples: score only this many test examples (0 = all).
        write: put the figures in the model's card.json and task.json (whole split only).
    """

    model_name: str
    max_examples: int = 0
    write: bool = False


def headline_metrics(metrics: dict[str, object], sep: str = ", ", short: bool = False) -> str:
    """A card's scores for ``sampan hub list``: ``test_f1=0.924, test_PER_f1=0.911, ...``;
    ``short`` drops the split's prefix (``f1=0.924``: every card's scores are held-out figures)."""
    def name(key: str) -> str:
        return key.removeprefix("test_").removeprefix("heldout_") if short else key

    def value(v: object) -> str:
        if not isinstance(v, float):
            return str(v)
        # the table's figures to 3 decimals when under 1 (0.075, not 0.0754), so the longest name
        # and figure (degraded_char_accuracy=0.615) fit one line of an 80-column table
        return f"{v:.3f}" if short and 0 < abs(v) < 1 else f"{v:.3g}"

    return sep.join(f"{name(k)}={value(v)}" for k, v in metrics.items() if k.endswith(_HEADLINE_SUFFIXES))


def run_list(args: argparse.Namespace) -> int:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    import sampan.hub as hub
    from sampan.hub.recipes import RECIPES

    listing = hub.list()
    if args.json:
        print(json.dumps(listing, ensure_ascii=False, indent=2))
        return 0
    home_models = hub.home() / "models"
    table = Table(title=f"sampan model store (built: {home_models}; shipped: sampan/hub/models)",
                  caption="every figure of every card: sampan hub list --json; build one: sampan hub build NAME",
                  box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    # Names and figures are what a reader copies or compares, so they are never cut: the name
    # column does not wrap, and each figure gets its own line.
    table.add_column("name", no_wrap=True)
    table.add_column("task", no_wrap=True)
    table.add_column("held-out metrics", overflow="fold", min_width=28)  # degraded_char_accuracy=0.615
    table.add_column("where", no_wrap=True)
    stored = {m["name"] for m in listing["models"]}
    for m in listing["models"]:
        # "built" or "shipped" rather than the path, which the title gives and 80 columns cannot hold
        where = "built" if Path(m["path"]).is_relative_to(home_models) else "shipped"
        table.add_row(m["name"], m["task"], headline_metrics(m["metrics"], "\n", short=True), where)
    for name in sorted(set(RECIPES) - stored):
        # The command goes in the caption: "not built: sampan hub build ernie-mini-zh" overflows 80
        # columns, and a word wider than "shipped" squeezes the figures until they fold.
        table.add_row(name, RECIPES[name].task, "", "unbuilt")
    Console().print(table)
    modules = Table(title="hub.Module(name=...)", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    modules.add_column("module", no_wrap=True)
    modules.add_column("what it does")
    for name, summary in listing["modules"].items():
        modules.add_row(name, summary)
    Console().print(modules)
    return 0


def _build_arguments(name: str):
    def add(parser: argparse.ArgumentParser) -> None:
        from sampan.hub.recipes import RECIPES  # torch-free: settings are plain configs
        from sampan.utils.flags import add_dataclass_args

        add_dataclass_args(parser, BuildOptions, metavars={"changes.set": "KEY=VALUE", "out": "DIR"})
        add_dataclass_args(parser, RECIPES[name].settings)

    return add


def run_build(args: argparse.Namespace) -> int:
    from sampan.hub.recipes import RECIPES, build
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(BuildOptions, args)
    settings = dataclass_from_args(RECIPES[args.recipe].settings, args)
    build(args.recipe, options.changes.set, out_root=Path(options.out) if options.out else None, settings=settings)
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(EvaluateOptions, args)
    if options.write and options.max_examples:
        raise ValueError("--write records whole-split figures; drop --max-examples")
    from sampan.hub.evaluate import evaluate_model, write_metrics

    metrics = evaluate_model(options.model_name, options.max_examples)
    print(json.dumps(metrics, ensure_ascii=False, indent=2))
    if options.write:
        print(f"wrote the figures to {write_metrics(options.model_name, metrics)}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    from sampan.store.models import RECIPE_NAMES  # torch-free and recipe-free: the names only
    from sampan.utils.flags import add_dataclass_args
    from sampan.utils.output import Output

    hub = subparsers.add_parser("hub", help="the local model store: list models, build them from recipes",
                                description="Models ship in the package and can be (re)built under "
                                            "$SAMPAN_HOME/models (default ~/.sampan) by the seeded recipes that "
                                            "made them.")
    actions = hub.add_subparsers(dest="hub_action", metavar="ACTION", required=True)
    lst = actions.add_parser("list", help="stored models with their held-out figures, and hub modules")
    add_dataclass_args(lst, Output)
    set_handler(lst, run_list)
    build = actions.add_parser(
        "build", help=f"run a model's recipe ({', '.join(RECIPE_NAMES)})",
        description="Build a store model from corpora that ship in packages: ernie-tiny-zh / ernie-mini-zh "
                    "(knowledge-masking pretraining), gpt-zh (causal LM), ernie-mini-sentiment (fine-tuned from "
                    "ernie-mini-zh), ernie-tiny-sentiment / ernie-tiny-ner (from ernie-tiny-zh); the base must "
                    "exist. Seeded: the same settings give the same model. Each recipe's settings are flags: "
                    "sampan hub build NAME --help.",
        epilog="example:  sampan hub build ernie-tiny-sentiment --finetune.training.max_steps 300")
    recipes = build.add_subparsers(dest="recipe", metavar="NAME", required=True)
    for name in RECIPE_NAMES:
        recipe = recipes.add_parser(name, help=f"build {name}",
                                    description=f"Build {name} with its recipe (sampan/hub/recipes.py); every "
                                                "setting is a flag, defaulting to what the shipped model was "
                                                "built with.")
        arguments_later(recipe, _build_arguments(name))
        set_handler(recipe, run_build)
    evaluate = actions.add_parser(
        "evaluate", help="score a stored task model on its held-out test split again",
        description="Re-run a task model's test evaluation (sentiment accuracy, NER span P / R / F1) on the stored "
                    "weights, as its recipe does, e.g. after a change to how predictions are decoded.",
        epilog="example:  sampan hub evaluate ernie-tiny-ner --write")
    add_dataclass_args(evaluate, EvaluateOptions, positional={"model_name": None}, metavars={"model_name": "NAME"})
    set_handler(evaluate, run_evaluate)

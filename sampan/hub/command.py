"""``sampan hub list|build|evaluate`` and ``sampan task``: the model store and Taskflow from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# The figures a table row has room for: the scores, not their losses, supports or precision /
# recall parts (``--json`` prints every figure of every card).
_HEADLINE_SUFFIXES = ("f1", "accuracy", "perplexity")


def headline_metrics(metrics: dict[str, object], sep: str = ", ", short: bool = False) -> str:
    """A card's scores for ``sampan hub list``: ``test_f1=0.924, test_PER_f1=0.911, ...``;
    ``short`` drops the split's prefix (``f1=0.924``: every card's scores are held-out figures)."""
    def name(key: str) -> str:
        return key.removeprefix("test_").removeprefix("heldout_") if short else key

    return sep.join(f"{name(k)}={v:.3g}" if isinstance(v, float) else f"{name(k)}={v}"
                    for k, v in metrics.items() if k.endswith(_HEADLINE_SUFFIXES))


def _cmd_hub_list(args: argparse.Namespace) -> int:
    from sampan import hub
    from sampan.hub.recipes import RECIPES

    listing = hub.list()
    if args.json:
        print(json.dumps(listing, ensure_ascii=False, indent=2))
        return 0
    from rich import box
    from rich.console import Console
    from rich.table import Table

    home_models = hub.home() / "models"
    table = Table(title=f"sampan model store (built: {home_models}; shipped: sampan/hub/models)",
                  caption="every figure of every card: sampan hub list --json", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
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


def _cmd_hub_build(args: argparse.Namespace) -> int:
    from pathlib import Path

    from sampan.hub.recipes import build

    build(args.name, args.set, out_root=Path(args.out) if args.out else None)
    return 0


def _cmd_hub_evaluate(args: argparse.Namespace) -> int:
    from sampan.hub.evaluate import evaluate_model, write_metrics

    if args.write and args.max_examples:
        print("sampan hub evaluate: --write records whole-split figures; drop --max-examples", file=sys.stderr)
        return 2
    metrics = evaluate_model(args.name, args.max_examples)
    print(json.dumps(metrics, ensure_ascii=False, indent=2))
    if args.write:
        print(f"wrote the figures to {write_metrics(args.name, metrics)}", file=sys.stderr)
    return 0


def parse_options(pairs: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` task options (values read as YAML scalars: ``seed=3`` is an int, ``0.7`` a
    float) -> ``{key: value}``; the task itself refuses a key it does not take."""
    from sampan.utils.settings import parse_assignments

    return parse_assignments(pairs, "--option", "max_new_tokens=32")


def _cmd_task(args: argparse.Namespace) -> int:
    from sampan.taskflow import Taskflow

    if args.list:
        print(json.dumps(Taskflow.tasks(), ensure_ascii=False, indent=2))
        return 0
    if not args.task:
        print("sampan task: name a task (sampan task --list shows them)", file=sys.stderr)
        return 2
    options = parse_options(args.option)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    flow = Taskflow(args.task, model=args.model, batch_size=args.batch_size, max_length=args.max_length,
                    precision=args.precision, **options)
    for result in flow(texts):
        print(json.dumps(result, ensure_ascii=False))
    return 0


def add_parsers(verbs) -> None:
    """Add the ``hub`` and ``task`` verbs to ``sampan``'s sub-parsers."""
    hub = verbs.add_parser("hub", help="the local model store: list models, build them from recipes",
                           description="Models ship in the package and can be (re)built under $SAMPAN_HOME/models "
                                       "(default ~/.sampan) by the seeded recipes that made them.")
    actions = hub.add_subparsers(dest="hub_action", metavar="ACTION", required=True)
    lst = actions.add_parser("list", help="stored models with their held-out figures, and hub modules")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(func=_cmd_hub_list)
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
    build.set_defaults(func=_cmd_hub_build)
    evaluate = actions.add_parser(
        "evaluate", help="score a stored task model on its held-out test split again",
        description="Re-run a task model's test evaluation (sentiment accuracy, NER span P / R / F1) on the stored "
                    "weights, as its recipe does, e.g. after a change to how predictions are decoded.",
        epilog="example:  sampan hub evaluate ernie-tiny-ner --write")
    evaluate.add_argument("name", help="a store model name or directory")
    evaluate.add_argument("--max-examples", type=int, default=0, help="score only this many test examples (0 = all)")
    evaluate.add_argument("--write", action="store_true",
                          help="put the figures in the model's card.json and task.json (whole split only)")
    evaluate.set_defaults(func=_cmd_hub_evaluate)

    task = verbs.add_parser("task", help="run a Taskflow task on texts (arguments or stdin lines)",
                            description="Run a task through the inference predictor and print one JSON line per "
                                        "text, e.g. sampan task sentiment_analysis 这家餐厅的服务非常棒",
                            epilog="tasks: sentiment_analysis, ner, word_segmentation, text_generation, "
                                   "poetry_generation, fill_mask. Example: sampan task poetry_generation 春 "
                                   "--option line_chars=5 --option seed=1")
    task.add_argument("task", nargs="?", help="task name")
    task.add_argument("text", nargs="*", help="texts (default: read lines from stdin)")
    task.add_argument("--model", default=None, help="a store model name or directory (default: the task's)")
    task.add_argument("--batch-size", type=int, default=32, help="(default: 32)")
    task.add_argument("--max-length", type=int, default=128,
                      help="tokens per text the model sees; longer ones are truncated with a warning "
                           "(ner tags them window by window) (default: 128)")
    task.add_argument("--precision", choices=("fp32", "int8"), default="fp32", help="(default: fp32)")
    task.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                      help="a task option, repeatable: max_new_tokens, min_new_tokens, temperature, top_k, "
                           "repetition_penalty, seed (generation); line_chars, lines (poetry); top_k (fill_mask)")
    task.add_argument("--list", action="store_true", help="list tasks and their models")
    task.set_defaults(func=_cmd_task)

"""Render the results tables of ``docs/benchmarks.md`` from ``benchmarks/results/*.json``, or check them.

Every figure in the performance, tasks and serving tables of ``docs/benchmarks.md`` is a field of a
results file that a benchmark wrote. The tables are written as templates in ``benchmarks/tables/NAME.md``;
each figure in them is a placeholder naming the field::

    time ratio **{{ model_step.ratio_sampan_over_baseline | .3f }}**

The expression before ``|`` reads results files by their stem (``model_step`` is
``benchmarks/results/model_step.json``), their keys by attribute (``.key``) or subscript
(``["dp2×mp2"]``, ``[0]``), and may combine them with ``+ - * /``, ``min``, ``max``, ``abs``,
``len``, ``round``, ``each(list, "field.path"[, "filter.path", value])`` (that field of every
item, or of those whose filter field equals the value) and ``pick(list, "field.path", value)``
(the one item whose field equals the value), ``shown(entry, "field.path", ".3f")`` (that field
formatted, or the status of an entry that was not measured: "not trained yet") and
``interval(entry, "field.path", "+.3f")`` (a ``difference`` with its ``ci95``, or that status);
``mark(a <= b)`` renders a goal's verdict (✅ / ❌)
from the figures, so a goal's mark changes when the run does. After ``|`` comes a Python format spec
(``.3f``, ``.1%``, ``,.0f``); ``cpu(model_step)`` renders the file's machine (its CPU capability).
Links in a template are relative to ``docs/``, where the table is rendered.

The rendered table sits in ``docs/benchmarks.md`` between ``<!-- results:NAME ... -->`` and
``<!-- /results:NAME -->`` (and, for the tables ``TOPIC_PAGES`` names, in their topic page too).
Rules the renderer enforces, so the page cannot drift from its runs:

- a figure column (named in the template's ``<!-- figures: a; b -->`` line, separated by ";") holds no literal
  number outside a placeholder or a code span;
- a table whose files were measured on more than one kind of machine has a ``CPU`` column;
- every results file a table reads records its machine.

``python benchmarks/results_tables.py`` rewrites the page's tables; ``--check`` exits 1 and
shows the difference when the page does not match (``tests/test_readme_figures.py`` runs the same
comparison).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
TEMPLATES = ROOT / "benchmarks" / "tables"
PAGE = ROOT / "docs" / "benchmarks.md"
# Topic pages that show some of the tables too, rendered from the same templates (so they cannot drift).
TOPIC_PAGES: dict[Path, tuple[str, ...]] = {ROOT / "docs" / "ocr.md": ("ocr",)}

_PLACEHOLDER = re.compile(r"\{\{(.+?)\}\}")
_FIGURES_LINE = re.compile(r"^<!--\s*figures:(.*?)-->\s*$", re.M)
_CODE_SPAN = re.compile(r"`[^`]*`")
# A number standing alone ("83.3%", "1.09×", "284"), not a digit inside a name ("int8", "fp32").
_LITERAL_NUMBER = re.compile(r"(?<![A-Za-z_\d.])\d")


def _path(item: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(item, dict) or key not in item:
            raise KeyError(f"no key {key!r} in {dotted!r}")
        item = item[key]
    return item


def _each(items: list[Any], dotted: str, where: str | None = None, equals: Any = None) -> list[Any]:
    """The field ``dotted`` of every item (of those whose field ``where`` equals ``equals``)."""
    return [_path(i, dotted) for i in items if where is None or _path(i, where) == equals]


def _reach(item: Any, dotted: str) -> tuple[Any, str | None]:
    """``(the field dotted, None)`` (a digit indexes a list), or ``(None, status)`` where the path
    stops at an entry whose ``status`` says it was not measured ("not trained yet", "not
    installed"). A missing field under a measured entry is an error."""
    for key in dotted.split("."):
        if isinstance(item, dict) and key in item:
            item = item[key]
        elif isinstance(item, list) and key.isdigit() and int(key) < len(item):
            item = item[int(key)]
        elif isinstance(item, dict) and item.get("status") not in (None, "measured"):
            return None, str(item["status"])
        else:
            raise KeyError(f"no key {key!r} in {dotted!r}")
    return item, None


def _shown(item: Any, dotted: str, spec: str = "") -> str:
    """The field ``dotted`` of ``item`` formatted with ``spec``, or the status of an entry not measured."""
    value, status = _reach(item, dotted)
    return status if status is not None else format(value, spec)


def _interval(item: Any, dotted: str, spec: str = "") -> str:
    """A difference with its interval, ``"d (low to high)"``, from the field ``dotted`` of ``item``
    (``{"difference": d, "ci95": [low, high]}``), or the status of an entry not measured."""
    value, status = _reach(item, dotted)
    if status is not None:
        return status
    low, high = value["ci95"]
    return f"{format(value['difference'], spec)} ({format(low, spec)} to {format(high, spec)})"


def _pick(items: list[Any], where: str, equals: Any) -> Any:
    """The one item whose field ``where`` equals ``equals``."""
    found = [i for i in items if _path(i, where) == equals]
    if len(found) != 1:
        raise KeyError(f"{len(found)} items have {where} == {equals!r}, not one")
    return found[0]


_FUNCTIONS = {"min": min, "max": max, "abs": abs, "len": len, "round": round,
              "each": _each, "pick": _pick, "shown": _shown, "interval": _interval,
              "mark": lambda ok: "✅" if ok else "❌"}
_COMPARE = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}
_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


class TableError(ValueError):
    """A template that cannot be rendered honestly: names the template, the placeholder and why."""


@dataclass
class Rendered:
    name: str
    text: str
    files: set[str]


class Results(Mapping[str, Any]):
    """Results files by stem, read once; an unknown stem names the files that exist."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._cache: dict[str, Any] = {}

    def __getitem__(self, stem: str) -> Any:
        if stem not in self._cache:
            path = self.folder / f"{stem}.json"
            if not path.is_file():
                known = ", ".join(sorted(p.stem for p in self.folder.glob("*.json")))
                raise KeyError(f"no results file {path.name} (there are: {known})")
            self._cache[stem] = json.loads(path.read_text(encoding="utf-8"))
        return self._cache[stem]

    def __iter__(self):
        return iter(sorted(p.stem for p in self.folder.glob("*.json")))

    def __len__(self) -> int:
        return len(list(self.folder.glob("*.json")))


def _evaluate(node: ast.AST, results: Results, used: set[str]) -> Any:
    """Evaluate the small expression language of a placeholder (no Python beyond it)."""
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, results, used)
    if isinstance(node, ast.Name):
        used.add(node.id)
        return results[node.id]
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return node.value
    if isinstance(node, ast.Attribute):
        value = _evaluate(node.value, results, used)
        if not isinstance(value, dict) or node.attr not in value:
            keys = ", ".join(value) if isinstance(value, dict) else type(value).__name__
            raise KeyError(f"no key {node.attr!r} (there: {keys})")
        return value[node.attr]
    if isinstance(node, ast.Subscript):
        value = _evaluate(node.value, results, used)
        key = _evaluate(node.slice, results, used)
        try:
            return value[key]
        except (KeyError, IndexError, TypeError) as exc:
            raise KeyError(f"no item {key!r}") from exc
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_evaluate(node.left, results, used),
                                      _evaluate(node.right, results, used))
    if (isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE):
        return _COMPARE[type(node.ops[0])](_evaluate(node.left, results, used),
                                           _evaluate(node.comparators[0], results, used))
    if isinstance(node, ast.BoolOp):
        values = [bool(_evaluate(v, results, used)) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, results, used)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        args = [_evaluate(a, results, used) for a in node.args]
        if node.func.id == "cpu":
            if len(node.args) != 1 or not isinstance(node.args[0], ast.Name):
                raise TableError("cpu() takes one results file's stem")
            return _machine(node.args[0].id, args[0])
        if node.func.id in _FUNCTIONS:
            return _FUNCTIONS[node.func.id](*args)
    raise TableError(f"{ast.dump(node)[:80]} is not allowed in a placeholder")


def _machine(stem: str, data: Any) -> str:
    machine = data.get("machine") if isinstance(data, dict) else None
    if not isinstance(machine, dict) or not machine.get("cpu_capability"):
        raise TableError(f"results/{stem}.json records no machine (machine.cpu_capability); rerun "
                         "its benchmark, which records it through benchmarks/_common.machine_info()")
    return str(machine["cpu_capability"])


def _render_placeholder(source: str, results: Results, used: set[str], where: str) -> str:
    expr, _, spec = source.partition("|")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
        value = _evaluate(tree, results, used)
        return format(value, spec.strip())
    except (KeyError, TableError, SyntaxError, ValueError, TypeError, ZeroDivisionError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        raise TableError(f"{where}: {{{{{source}}}}}: {msg}") from None


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def render(name: str, results: Results | None = None, templates: Path = TEMPLATES) -> Rendered:
    """Render ``templates/NAME.md`` (``benchmarks/tables`` by default) against the results files."""
    results = results if results is not None else Results(RESULTS)
    path = templates / f"{name}.md"
    template = path.read_text(encoding="utf-8")
    figures_match = _FIGURES_LINE.search(template)
    if figures_match is None:
        raise TableError(f"{path.name}: no '<!-- figures: column; ... -->' line naming the figure columns")
    figure_columns = {c.strip() for c in figures_match.group(1).split(";") if c.strip()}
    # The figures line renders as nothing; numbering stays the template file's own, for errors.
    lines = ["" if _FIGURES_LINE.match(line) else line for line in template.splitlines()]
    table_rows = [i for i, line in enumerate(lines) if line.lstrip().startswith("|")]
    if len(table_rows) < 2:
        raise TableError(f"{path.name}: no markdown table")
    header = _cells(_PLACEHOLDER.sub("", lines[table_rows[0]]))
    missing = figure_columns - set(header)
    if missing:
        raise TableError(f"{path.name}: figure columns {sorted(missing)} are not in the header {header}")
    figure_index = [i for i, h in enumerate(header) if h in figure_columns]

    used: set[str] = set()
    out: list[str] = []
    for number, line in enumerate(lines, 1):
        where = f"{path.name}:{number}"
        if number - 1 in table_rows[2:]:
            # A placeholder's own "|" is not a cell border: drop placeholders before splitting.
            cells = _cells(_PLACEHOLDER.sub("", line))
            for i in figure_index:
                if i < len(cells):
                    bare = _CODE_SPAN.sub("", cells[i])
                    if _LITERAL_NUMBER.search(bare):
                        raise TableError(f"{where}: column {header[i]!r} has a number that is not a "
                                         f"placeholder: {bare.strip()!r}; read it from a results file")
        out.append(_PLACEHOLDER.sub(lambda m, at=where: _render_placeholder(m.group(1), results, used, at), line))

    machines = {stem: _machine(stem, results[stem]) for stem in sorted(used)}
    if len(set(machines.values())) > 1 and "CPU" not in header:
        raise TableError(f"{path.name}: its figures come from more than one kind of machine "
                         f"({machines}); give the table a CPU column that says which")
    return Rendered(name, "\n".join(out).strip("\n") + "\n", used)


def table_names(templates: Path = TEMPLATES) -> list[str]:
    return sorted(p.stem for p in templates.glob("*.md"))


def _section(name: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- results:{re.escape(name)}\b[^>]*-->\n)(.*?)(<!-- /results:{re.escape(name)} -->)", re.S)


def rendered_page(page: str, results: Results | None = None, templates: Path = TEMPLATES,
                  names: tuple[str, ...] | None = None, where: Path = PAGE) -> tuple[str, dict[str, Rendered]]:
    """The page (``docs/benchmarks.md``'s text, or ``where``'s) with every results section (of
    ``names``, default all templates) replaced by its rendering."""
    results = results if results is not None else Results(RESULTS)
    tables: dict[str, Rendered] = {}
    for name in table_names(templates) if names is None else names:
        pattern = _section(name)
        if not pattern.search(page):
            raise TableError(f"{where.relative_to(ROOT)} has no '<!-- results:{name} -->' ... "
                             f"'<!-- /results:{name} -->' section for benchmarks/tables/{name}.md")
        tables[name] = render(name, results, templates)
        page = pattern.sub(lambda m, t=tables[name]: m.group(1) + t.text + m.group(3), page)
    return page, tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 and print the difference when the page does not match the results")
    parser.add_argument("--page", type=Path, default=None,
                        help="the one page to render every table into (default: docs/benchmarks.md, and the "
                             "topic pages' own tables: " + ", ".join(p.name for p in TOPIC_PAGES) + ")")
    args = parser.parse_args(argv)
    pages = {args.page: None} if args.page is not None else {PAGE: None, **TOPIC_PAGES}
    status = 0
    for path, names in pages.items():
        current = path.read_text(encoding="utf-8")
        try:
            updated, tables = rendered_page(current, names=names, where=path)
        except TableError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        name = path.name
        if args.check:
            if updated != current:
                sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), updated.splitlines(True),
                                                           name, f"{name} (from the results)"))
                print(f"{name}'s tables differ from benchmarks/results: run python benchmarks/results_tables.py",
                      file=sys.stderr)
                status = 1
            else:
                print(f"{name} matches benchmarks/results ({', '.join(tables)})")
            continue
        if updated != current:
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_text(updated, encoding="utf-8")
            tmp.replace(path)
        print(f"{name}: {', '.join(f'{n} ({len(t.files)} results files)' for n, t in tables.items())}")
    return status


if __name__ == "__main__":
    sys.exit(main())

"""sampan's packages import only downward, as docs/architecture.md's table says, and nothing loops.

What counts as an import, read from the syntax tree (so docstrings and comments never count):

- every ``import`` and ``from ... import``: at module level, inside functions, under
  ``if TYPE_CHECKING:``, and relative ones, resolved against the file's own package. A
  function-level import that goes up a layer is the same knot as a module-level one, only hidden
  until that function runs;
- ``import sampan`` and ``from sampan import name``, where ``name`` is defined in
  ``sampan/__init__.py``: they import the root package, which sits in the top layer.
  ``from sampan import hub`` imports the subpackage ``hub``;
- a module run in a subprocess: a string literal ``"sampan.X"`` right after a ``"-m"`` literal
  in one list, tuple or call's arguments, or one literal that begins ``"-m sampan.X"``. A server
  spawned as ``python -m sampan.cli`` depends on the command line as surely as an import does.

Three checks, each naming the file and line to edit:

1. layers: no import reaches a package of a higher layer of ``LAYERS``;
2. package cycles: no loop of any length among the packages (a strongly connected component of
   two or more), inside one layer or across layers;
3. file cycles: no loop of any length among the ``.py`` files of one package.

Cost: parses sampan's ~250 files once per check (well under a second each); the planted cases
copy the package's source (not the shipped weights) into a temporary directory first.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sampan"

# Bottom to top. A package may import its own layer's packages (no cycle among them: checked
# below) and every layer under it; never one above. docs/architecture.md explains each layer.
LAYERS: list[tuple[str, ...]] = [
    ("utils", "_version"),
    ("tensor", "store"),
    ("amp", "static", "nn", "optimizer", "checkpoint", "io"),
    ("jit", "models"),
    ("text",),
    ("distributed",),
    ("trainer",),
    ("pretraining", "finetune", "planner", "vision"),
    ("inference",),
    ("taskflow",),
    ("serving",),
    ("hub",),
    ("demo", "cli", "commands", "runfile", "server_process", "__init__"),
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}

@dataclass(frozen=True)
class Import:
    """One dependency of one file: ``file:line`` imports (or runs, when ``spawned``) ``module``."""

    file: str  # relative to the package's parent: "sampan/trainer/backend.py"
    line: int
    module: str  # dotted: "sampan.trainer.fleet_backend"; the bare package name for the root
    spawned: bool = False  # a `-m` module run in a subprocess, not imported into this process
    type_checking: bool = False  # under `if TYPE_CHECKING:`: read by type checkers, never run

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _unit(path: Path, package: Path) -> str:
    """The top-level unit a file belongs to: ``sampan/text/x.py`` -> text, ``sampan/amp.py`` -> amp."""
    rel = path.relative_to(package)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _unit_of_module(module: str) -> str:
    """``sampan.text.tokenizer`` -> text; the bare ``sampan`` -> ``__init__`` (the root package)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_parts(path: Path, package: Path) -> list[str]:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _is_module(module: str, package: Path) -> bool:
    """Whether ``module`` (``sampan.x.y``) names a module or subpackage on disk, not a name inside one."""
    where = package.parent.joinpath(*module.split("."))
    return where.is_dir() or where.with_suffix(".py").is_file()


def file_of(module: str, package: Path) -> Path | None:
    """The file that running ``import module`` executes last: ``x/__init__.py`` or ``x.py``."""
    where = package.parent.joinpath(*module.split("."))
    for candidate in (where / "__init__.py", where.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring nodes: the leading string of a module, class or function body."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                found.add(id(first.value))
    return found


class _Reader(ast.NodeVisitor):
    """Collects a file's imports of ``package`` and its ``-m package.X`` module strings."""

    def __init__(self, path: Path, package: Path, docstrings: set[int]):
        self.file = str(path.relative_to(package.parent))
        self.package = package
        self.root = package.name
        self.here = _module_parts(path, package)
        self.is_init = path.name == "__init__.py"
        self.docstrings = docstrings
        self.type_checking = False
        self.found: list[Import] = []
        self.m_literal = re.compile(rf"-m\s+({re.escape(self.root)}(?:\.\w+)*)\b")
        self.m_argument = re.compile(rf"{re.escape(self.root)}(?:\.\w+)*")

    def _ours(self, module: str) -> bool:
        return module == self.root or module.startswith(self.root + ".")

    def _add(self, node: ast.AST, module: str, spawned: bool = False) -> None:
        self.found.append(Import(self.file, node.lineno, module, spawned, self.type_checking))

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.visit(node.test)
        outer, self.type_checking = self.type_checking, True
        for child in node.body:
            self.visit(child)
        self.type_checking = outer
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        # `import sampan.x.y` runs sampan/__init__.py and sampan/x/__init__.py on the way; those
        # implicit parent runs are not counted (see `file_cycles`), the module named is.
        for alias in node.names:
            if self._ours(alias.name):
                self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.here if self.is_init else self.here[:-1]
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        if not self._ours(module):
            return
        targets = []
        for alias in node.names:
            # `from sampan.x import y`: y is a submodule (that module is imported) or a name that
            # sampan/x/__init__.py defines (then x's __init__ is what this file needs).
            sub = f"{module}.{alias.name}"
            targets.append(sub if alias.name != "*" and _is_module(sub, self.package) else module)
        for target in dict.fromkeys(targets):
            self._add(node, target)

    def _spawned_in(self, items: Iterable[ast.expr]) -> None:
        """``[..., "-m", "sampan.cli", ...]``: the literal after ``"-m"`` is a module to be run."""
        for flag, name in itertools.pairwise(items):
            if isinstance(flag, ast.Constant) and flag.value == "-m" and isinstance(name, ast.Constant) \
                    and isinstance(name.value, str) and self.m_argument.fullmatch(name.value):
                self._add(name, name.value, spawned=True)

    def visit_List(self, node: ast.List) -> None:
        self._spawned_in(node.elts)
        self.generic_visit(node)

    def visit_Tuple(self, node: ast.Tuple) -> None:
        self._spawned_in(node.elts)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self._spawned_in(node.args)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and id(node) not in self.docstrings:
            match = self.m_literal.match(node.value)
            if match:
                self._add(node, match.group(1), spawned=True)


def imports_of(path: Path, package: Path) -> list[Import]:
    """Every dependency of ``path`` on ``package`` (see the module docstring for what counts)."""
    return list(_read(path, package, path.read_text(encoding="utf-8")))


@functools.lru_cache(maxsize=4096)
def _read(path: Path, package: Path, text: str) -> tuple[Import, ...]:
    # Keyed by the text too: each check re-reads every file, but parses only what changed.
    tree = ast.parse(text, filename=str(path))
    reader = _Reader(path, package, _docstrings(tree))
    reader.visit(tree)
    return tuple(reader.found)


def all_imports(package: Path) -> dict[Path, list[Import]]:
    return {path: imports_of(path, package) for path in sorted(package.rglob("*.py"))}


def _describe(imp: Import, layer: int | None = None) -> str:
    """``imports sampan.x.y (x, layer 3)``, ``runs -m sampan.cli (cli, layer 12)``."""
    unit = _unit_of_module(imp.module)
    what = "the root package, its __init__.py" if unit == "__init__" else unit
    where = f"{what}, layer {layer}" if layer is not None else what
    return f"{'runs -m' if imp.spawned else 'imports'} {imp.module} ({where})"


def violations(package: Path = PACKAGE, layer_of: dict[str, int] = LAYER_OF) -> list[str]:
    """Each import against the table, as ``file:line: a (layer i) imports m (b, layer j), ...``."""
    problems = []
    for path, found in all_imports(package).items():
        unit = _unit(path, package)
        if unit not in layer_of:
            problems.append(f"{path.relative_to(package.parent)}: {unit} is in no layer of the table")
            continue
        for imp in found:
            target = _unit_of_module(imp.module)
            if target == unit:
                continue
            if target not in layer_of:
                problems.append(f"{imp.where}: {_describe(imp)}, which is in no layer")
            elif layer_of[target] > layer_of[unit]:
                problems.append(f"{imp.where}: {unit} (layer {layer_of[unit]}) "
                                f"{_describe(imp, layer_of[target])}, a layer above it")
    return problems


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph`` (node -> successors), iteratively (no
    recursion limit), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(sorted(component))
    return sorted(components)


def _loops(edges: dict[tuple[str, str], Import], what: str) -> list[str]:
    """Each strongly connected component of more than one node, with one import per edge inside it."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    reports = []
    for component in strongly_connected(graph):
        if len(component) < 2:
            continue
        members = set(component)
        inside = sorted((a, b) for a, b in edges if a in members and b in members)
        reports.append(f"{what} {', '.join(component)} import each other in a loop: "
                       + "; ".join(f"{a} -> {b} at {edges[a, b].where}" for a, b in inside))
    return reports


def package_cycles(package: Path = PACKAGE) -> list[str]:
    """Loops of any length among the packages (units), in one layer or across layers. Every kind of
    dependency counts here (TYPE_CHECKING and ``-m`` ones too): each ties the packages' fates."""
    edges: dict[tuple[str, str], Import] = {}
    for path, found in all_imports(package).items():
        unit = _unit(path, package)
        for imp in found:
            target = _unit_of_module(imp.module)
            if target != unit:
                edges.setdefault((unit, target), imp)
    return _loops(edges, "packages")


def file_cycles(package: Path = PACKAGE) -> list[str]:
    """Loops of any length among the files of one package.

    An edge is an import that runs in this process and lands on a file of the same package:
    ``from sampan.x.a import f`` is an edge to ``x/a.py``, ``from sampan.x import name`` one to
    ``x/__init__.py`` (Python runs that file for ``name``; when ``__init__.py`` also imports the
    importing file, the second import finds the package half-built: a real loop). Left out:

    - the parent packages' ``__init__.py`` that Python runs before any submodule: by then the
      parent is already in ``sys.modules`` (it is the one importing, or it finished), so nothing
      re-runs; counting them would put every package that re-exports a submodule in a loop;
    - imports under ``if TYPE_CHECKING:``: they never run (they still count for the layers);
    - ``-m`` modules: they run in another process (they still count for the layers and packages).
    """
    edges: dict[tuple[str, str], Import] = {}
    by_unit: dict[str, dict[tuple[str, str], Import]] = {}
    for path, found in all_imports(package).items():
        unit = _unit(path, package)
        source = str(path.relative_to(package.parent))
        for imp in found:
            if imp.spawned or imp.type_checking or _unit_of_module(imp.module) != unit:
                continue
            target = file_of(imp.module, package)
            if target is None or target == path:
                continue
            edge = (source, str(target.relative_to(package.parent)))
            if edge not in edges:
                edges[edge] = imp
                by_unit.setdefault(unit, {})[edge] = imp
    return [report for unit in sorted(by_unit) for report in _loops(by_unit[unit], f"files of {unit}:")]


def test_every_import_goes_down_the_layers():
    assert violations() == []


def test_no_packages_import_each_other_in_a_loop():
    assert package_cycles() == []


def test_no_files_of_a_package_import_each_other_in_a_loop():
    assert file_cycles() == []


def test_the_table_names_every_package_and_docs_show_it():
    units = {_unit(p, PACKAGE) for p in PACKAGE.rglob("*.py")}
    assert units <= set(LAYER_OF), f"packages missing from LAYERS: {sorted(units - set(LAYER_OF))}"
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name in LAYER_OF:
        if name != "__init__":
            assert f"`{name}`" in doc, f"docs/architecture.md does not place `{name}`"


# --- the checker itself, on a copy of the package with one bad dependency planted in it ---


@pytest.fixture
def copy(tmp_path) -> Path:
    """sampan's source, ``sampan/models/`` included; only the shipped weights (``hub/models``),
    ``__pycache__`` and ``*.safetensors`` stay behind."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n == "__pycache__" or n.endswith(".safetensors")}
        if Path(directory) == PACKAGE / "hub":
            skip.add("models")
        return skip

    target = tmp_path / "sampan"
    shutil.copytree(PACKAGE, target, ignore=ignore)
    assert (target / "models" / "pretrained.py").is_file() and not (target / "hub" / "models").exists()
    return target


def _plant(package: Path, rel: str, text: str) -> int:
    """Append ``text`` (starting with a newline) to ``package/rel``; the line number of its first line."""
    path = package / rel
    original = path.read_text(encoding="utf-8")
    assert original.endswith("\n") and text.startswith("\n")
    path.write_text(original + text[1:], encoding="utf-8")
    return original.count("\n") + 1


@pytest.mark.parametrize("rel, text, offset, what", [
    ("store/models.py", "\nfrom sampan.hub.recipes import RECIPES\n", 0,
     "store (layer 1) imports sampan.hub.recipes (hub, layer 11)"),
    ("text/tokenizer.py", "\ndef _late():\n    from sampan.trainer import Trainer\n", 1,
     "text (layer 4) imports sampan.trainer (trainer, layer 6)"),
    ("nn/layer.py", "\ndef _late():\n    import sampan.distributed.fleet\n", 1,
     "nn (layer 2) imports sampan.distributed.fleet (distributed, layer 5)"),
    ("utils/paths.py", "\nfrom ..finetune import base\n", 0,
     "utils (layer 0) imports sampan.finetune.base (finetune, layer 7)"),
    # inside sampan/models/, under TYPE_CHECKING: it never runs, but it still ties models to text
    ("models/llama/modeling.py", "\nimport typing\nif typing.TYPE_CHECKING:\n    from sampan.text import Tokenizer\n",
     2, "models (layer 3) imports sampan.text (text, layer 4)"),
], ids=["store", "text-in-function", "nn-bare-submodule", "utils-relative", "models-type-checking"])
def test_a_planted_upward_import_is_caught(copy, rel, text, offset, what):
    line = _plant(copy, rel, text) + offset
    assert violations(copy) == [f"sampan/{rel}:{line}: {what}, a layer above it"]


def test_a_planted_bare_import_of_sampan_is_caught(copy):
    first = _plant(copy, "utils/paths.py", "\ndef _late():\n    import sampan\n")
    second = _plant(copy, "tensor.py", "\nfrom sampan import __version__, utils\n")
    root = "sampan (the root package, its __init__.py, layer 12), a layer above it"
    # `utils` in the second line is a subpackage: tensor may import it, so only __version__ counts
    assert violations(copy) == [f"sampan/tensor.py:{second}: tensor (layer 1) imports {root}",
                                f"sampan/utils/paths.py:{first + 1}: utils (layer 0) imports {root}"]


def test_a_planted_module_spawn_is_caught_in_code_not_in_docstrings(copy):
    line = _plant(copy, "io/dataloader.py", '\nimport subprocess\nimport sys\n\n\ndef _spawn():\n'
                  '    """-m sampan.cli is how a docstring may say it: not a dependency."""\n'
                  '    subprocess.run([sys.executable, "-m", "sampan.cli", "train"])  # -m sampan.hub in a comment\n'
                  '    return "-m sampan.serving --port 0"\n')
    assert violations(copy) == [
        f"sampan/io/dataloader.py:{line + 6}: io (layer 2) runs -m sampan.cli (cli, layer 12), a layer above it",
        f"sampan/io/dataloader.py:{line + 7}: io (layer 2) runs -m sampan.serving (serving, layer 10), "
        "a layer above it",
    ]


def test_a_planted_loop_of_three_packages_is_caught(copy):
    """pretraining, finetune and planner share layer 7: each import is allowed, the loop is not."""
    a = _plant(copy, "pretraining/config.py", "\ndef _late():\n    from sampan.finetune import metrics\n") + 1
    b = _plant(copy, "finetune/metrics.py", "\ndef _late():\n    import sampan.planner.report\n") + 1
    c = _plant(copy, "planner/report.py", "\ndef _late():\n    from sampan.pretraining.config import PretrainConfig\n") + 1
    assert violations(copy) == []
    assert package_cycles(copy) == [
        "packages finetune, planner, pretraining import each other in a loop: "
        f"finetune -> planner at sampan/finetune/metrics.py:{b}; "
        f"planner -> pretraining at sampan/planner/report.py:{c}; "
        f"pretraining -> finetune at sampan/pretraining/config.py:{a}"]


def test_a_planted_loop_of_files_is_caught(copy):
    """Three files of text, one link inside a function (it runs when called: still a loop)."""
    text = "sampan/text"
    a = _plant(copy, "text/spans.py", "\nfrom sampan.text.features import pinyin_ids\n")
    b = _plant(copy, "text/features.py", "\nfrom . import char_vocab\n")
    c = _plant(copy, "text/char_vocab.py", "\ndef _late():\n    from .spans import knowledge_spans\n") + 1
    assert file_cycles(copy) == [
        f"files of text: {text}/char_vocab.py, {text}/features.py, {text}/spans.py import each other in a loop: "
        f"{text}/char_vocab.py -> {text}/spans.py at {text}/char_vocab.py:{c}; "
        f"{text}/features.py -> {text}/char_vocab.py at {text}/features.py:{b}; "
        f"{text}/spans.py -> {text}/features.py at {text}/spans.py:{a}"]
    assert violations(copy) == [] and package_cycles(copy) == []


def test_a_planted_loop_through_a_package_init_is_caught(copy):
    """io/__init__.py re-exports io/dataset.py; dataset taking a name from the package closes a loop
    (importing sampan.io.dataset first would find sampan.io half-built, without DataLoader)."""
    line = _plant(copy, "io/dataset.py", "\nfrom sampan.io import DataLoader\n")
    init = next(imp for imp in imports_of(copy / "io" / "__init__.py", copy) if imp.module == "sampan.io.dataset")
    assert file_cycles(copy) == [
        "files of io: sampan/io/__init__.py, sampan/io/dataset.py import each other in a loop: "
        f"sampan/io/__init__.py -> sampan/io/dataset.py at {init.where}; "
        f"sampan/io/dataset.py -> sampan/io/__init__.py at sampan/io/dataset.py:{line}"]


def test_a_type_checking_only_loop_of_files_is_not_one(copy):
    """Imports under TYPE_CHECKING never run, so they close no loop of files."""
    _plant(copy, "io/dataset.py", "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
           "    from sampan.io import DataLoader\n")
    planted = imports_of(copy / "io" / "dataset.py", copy)[-1]
    assert (planted.module, planted.type_checking) == ("sampan.io", True)
    assert file_cycles(copy) == []


def test_strongly_connected_components():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"f"}, "g": set()}
    assert strongly_connected(graph) == [["a", "b", "c"], ["d", "e"], ["f"], ["g"]]
    chain = {str(i): {str(i + 1)} for i in range(5000)} | {"5000": {"0"}}  # deep: no recursion limit
    assert strongly_connected(chain) == [sorted(chain)]

"""sampan's packages import only downward, as docs/architecture.md's table says.

Every import counts, the ones inside functions included: a function-level import that goes up a
layer is the same knot as a module-level one, only hidden until that function runs.
"""

from __future__ import annotations

import ast
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
    ("pretraining", "finetune", "planner"),
    ("inference",),
    ("taskflow",),
    ("serving",),
    ("hub",),
    ("demo", "cli", "commands", "__init__"),
]
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _unit(path: Path, package: Path) -> str:
    """The top-level unit a file belongs to: ``sampan/text/x.py`` -> text, ``sampan/amp.py`` -> amp."""
    rel = path.relative_to(package)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _module_name(path: Path, package: Path) -> list[str]:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imports_of(path: Path, package: Path) -> list[tuple[str, int]]:
    """Every ``sampan.X`` unit ``path`` imports (module level, in functions, under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = _module_name(path, package)
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here if is_package else here[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == package.name:  # `from sampan import x`: a subpackage, or a name of sampan/__init__.py
                names = [f"{module}.{a.name}" if (package / a.name).is_dir() or (package / f"{a.name}.py").is_file()
                         else f"{module}.__init__" for a in node.names]
            else:
                names = [module]
        for name in names:
            parts = name.split(".")
            if parts[0] == package.name and len(parts) > 1:
                found.append((parts[1], node.lineno))
    return found


def violations(package: Path = PACKAGE, layer_of: dict[str, int] = LAYER_OF) -> list[str]:
    """Each import against the table, as ``file:line: a (layer i) imports b (layer j)``."""
    problems = []
    for path in sorted(package.rglob("*.py")):
        unit = _unit(path, package)
        if unit not in layer_of:
            problems.append(f"{path.relative_to(package.parent)}: {unit} is in no layer of the table")
            continue
        for target, line in imports_of(path, package):
            if target == unit:
                continue
            if target not in layer_of:
                problems.append(f"{path.relative_to(package.parent)}:{line}: imports {target}, which is in no layer")
            elif layer_of[target] > layer_of[unit]:
                problems.append(f"{path.relative_to(package.parent)}:{line}: {unit} (layer {layer_of[unit]}) "
                                f"imports {target} (layer {layer_of[target]}), a layer above it")
    return problems


def cycles_within_layers(package: Path = PACKAGE, layer_of: dict[str, int] = LAYER_OF) -> list[str]:
    """Packages of one layer may import each other, but not both ways round."""
    edges: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        unit = _unit(path, package)
        for target, _ in imports_of(path, package):
            if target != unit and layer_of.get(target) == layer_of.get(unit):
                edges.setdefault(unit, set()).add(target)
    return sorted(f"{a} <-> {b}" for a in edges for b in edges[a] if a < b and a in edges.get(b, set()))


def test_every_import_goes_down_the_layers():
    assert violations() == []
    assert cycles_within_layers() == []


def test_the_table_names_every_package_and_docs_show_it():
    units = {_unit(p, PACKAGE) for p in PACKAGE.rglob("*.py")}
    assert units <= set(LAYER_OF), f"packages missing from LAYERS: {sorted(units - set(LAYER_OF))}"
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name in LAYER_OF:
        if name != "__init__":
            assert f"`{name}`" in doc, f"docs/architecture.md does not place `{name}`"


@pytest.mark.parametrize("planted", [
    ("store/models.py", "\nfrom sampan.hub.recipes import RECIPES\n"),
    ("text/tokenizer.py", "\ndef _late():\n    from sampan.trainer import Trainer\n"),
    ("nn/layer.py", "\ndef _late():\n    import sampan.distributed.fleet\n"),
    ("utils/paths.py", "\nfrom ..finetune import base\n"),
])
def test_a_planted_upward_import_is_caught(tmp_path, planted):
    """The checker itself: a copy of the package with one import going up fails it, naming the line."""
    import shutil

    copy = tmp_path / "sampan"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("models", "__pycache__", "*.safetensors"))
    rel, text = planted
    target = copy / rel
    target.write_text(target.read_text(encoding="utf-8") + text, encoding="utf-8")
    found = violations(copy)
    assert len(found) == 1 and found[0].startswith(f"sampan/{rel}:"), found
    assert "a layer above it" in found[0]


def test_a_cycle_inside_a_layer_is_caught(tmp_path):
    package = tmp_path / "pkg"
    for name, imports in {"a": "from pkg.b import x\n", "b": "def f():\n    from pkg.a import y\n"}.items():
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text(imports, encoding="utf-8")
    assert cycles_within_layers(package, {"a": 0, "b": 0}) == ["a <-> b"]
    assert violations(package, {"a": 0, "b": 0}) == []

"""The lazily loaded packages spell each name three times: a ``TYPE_CHECKING`` import (for type
checkers and IDEs), the table their ``__getattr__`` loads from, and the literal ``__all__`` (which
ruff reads). Nothing ties the three together at run time, so this test does: a name added to one
and not the others would be invisible to an IDE, unloadable, or missing from ``import *``."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "sampan"


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """name -> module, from the ``if TYPE_CHECKING:`` block."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom), ast.dump(stmt)
                for alias in stmt.names:
                    found[alias.asname or alias.name] = stmt.module
    return found


def _eager_imports(tree: ast.Module) -> set[str]:
    """Names imported at module level from inside the package (loaded at import, not lazily)."""
    names = {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
             and node.module and node.module.startswith("sampan.") for alias in node.names}
    # private helpers and the lazy-loading machinery itself are not exported
    return {name for name in names if not name.startswith("_") and name != "lazy_exports"}


def _literal(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} is not assigned a literal")


def _lazy_table(package: str, tree: ast.Module) -> dict[str, str]:
    """name -> module, from the table ``__getattr__`` loads names from."""
    if package == "sampan.finetune":
        return {name: f"sampan.finetune.{module}" for module, names in _literal(tree, "_SUBMODULES").items()
                for name in names}
    return dict(_literal(tree, "_EXPORTERS"))


@pytest.mark.parametrize("package", ["sampan.finetune", "sampan.inference", "sampan.models", "sampan.models.gpt",
                                     "sampan.models.ernie", "sampan.models.llama"])
def test_lazy_names_agree_across_type_checking_table_and_all(package: str):
    tree = ast.parse((ROOT / package.split(".", 1)[1].replace(".", "/") / "__init__.py").read_text(encoding="utf-8"))
    typed, table = _type_checking_imports(tree), _lazy_table(package, tree)
    assert typed == table, f"{package}: TYPE_CHECKING imports and the lazy table differ"
    exported = _literal(tree, "__all__")
    assert len(exported) == len(set(exported)), f"{package}.__all__ repeats a name"
    defined = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
               if isinstance(t, ast.Name) and not t.id.startswith("_")}  # a family's SPEC
    assert set(exported) == set(table) | _eager_imports(tree) | defined, f"{package}.__all__ and its imports differ"

    module = importlib.import_module(package)
    for name, source in table.items():
        # each lazy name resolves to the object its table says, defined where the table says
        assert getattr(module, name) is getattr(importlib.import_module(source), name)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        module.not_a_name  # noqa: B018 - the attribute access is the test

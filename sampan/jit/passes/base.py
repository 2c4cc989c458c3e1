"""What every AST pass shares: the conversion context, fresh names, templates and scope analysis.

Generated names start with ``_jst_`` (the runtime converter module itself is bound to ``_jst``
inside converted code), so they never collide with user names and scope analysis can tell
generated helper functions from the user's own.
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
from collections.abc import Callable, Iterable
from typing import Any

JST = "_jst"
PREFIX = "_jst_"


class Dy2StaticError(RuntimeError):
    """Every failure of ``to_static`` / ``jit.save`` to convert or capture a function.

    The message starts with the user's ``file:line``, names the construct and says what to change;
    an error from torch that caused it is chained (``__cause__``), never raised on its own.
    """


class ConversionError(SyntaxError, Dy2StaticError):
    """Raised at conversion time (from the source, before any run) for a construct ``to_static``
    cannot turn into a graph. Also a ``SyntaxError``, as it is about the code as written."""


@dataclasses.dataclass
class PassContext:
    """State shared by the passes while converting one function.

    Fields:
        filename: the user's source file (generated code keeps the user's line numbers).
        func_name: the function being converted.
        carried: names that generated ``IfElse`` / ``While`` calls pass around; the
            ``undefined_vars`` pass gives them a placeholder value at the top of their function.
        resolve_call: given a call's function expression, the converted callee to call instead
            (or None); supplied by the translator, which can see the function's globals.
        bindings: generated name -> object, bound as free variables of the converted function.
        decorators: the function's own decorators (but ``to_static``), re-applied by the translator
            to the converted function.
    """

    filename: str
    func_name: str
    carried: set[str] = dataclasses.field(default_factory=set)
    resolve_call: Callable[[ast.expr], Any] | None = None
    bindings: dict[str, Any] = dataclasses.field(default_factory=dict)
    decorators: list[ast.expr] = dataclasses.field(default_factory=list)
    _counter: itertools.count = dataclasses.field(default_factory=itertools.count)

    def fresh(self, kind: str) -> str:
        """A new generated name such as ``_jst_true_3``."""
        return f"{PREFIX}{kind}_{next(self._counter)}"

    def where(self, node: ast.AST) -> str:
        return f"{self.filename}:{getattr(node, 'lineno', '?')}"

    def error(self, node: ast.AST, what: str, fix: str) -> ConversionError:
        return ConversionError(f"{self.where(node)}: {what} in '{self.func_name}'. {fix}")


def _strip_locations(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if hasattr(node, attr):
                delattr(node, attr)


class _Substitute(ast.NodeTransformer):
    def __init__(self, subs: dict[str, object]):
        self.subs = subs

    def visit_Name(self, node: ast.Name):
        value = self.subs.get(node.id)
        return node if value is None else value

    def visit_Expr(self, node: ast.Expr):
        # A bare placeholder statement stands for a list of statements (a body).
        if isinstance(node.value, ast.Name) and isinstance(self.subs.get(node.value.id), list):
            return self.subs[node.value.id]
        return self.generic_visit(node)


def template(src: str, like: ast.AST, **subs) -> list[ast.stmt]:
    """Parse ``src`` into statements located at ``like`` (the user statement they replace).

    Each keyword replaces the placeholder name of that key: with an expression node, or with a
    list of statements when the placeholder stands alone on its line. User nodes substituted in
    keep their own locations, so errors inside them still point at the user's line.
    """
    body = ast.parse(src).body
    for stmt in body:
        _strip_locations(stmt)
    module = _Substitute(subs).visit(ast.Module(body=body, type_ignores=[]))
    for stmt in module.body:
        ast.copy_location(stmt, like)
        _fill_locations(stmt, like)
    return module.body


def expr(src: str, like: ast.AST, **subs) -> ast.expr:
    """Like :func:`template` for one expression."""
    (stmt,) = template(src, like, **subs)
    assert isinstance(stmt, ast.Expr)
    return stmt.value


def _fill_locations(node: ast.AST, like: ast.AST) -> None:
    for child in ast.walk(node):
        if "lineno" in child._attributes and not hasattr(child, "lineno"):
            ast.copy_location(child, like)
            child.end_lineno = getattr(like, "end_lineno", None)
            child.end_col_offset = getattr(like, "end_col_offset", None)


def names_tuple(names: Iterable[str], ctx: type[ast.expr_context] = ast.Load) -> ast.Tuple:
    return ast.Tuple(elts=[ast.Name(id=n, ctx=ctx()) for n in names], ctx=ctx())


def strings_tuple(names: Iterable[str]) -> ast.Tuple:
    return ast.Tuple(elts=[ast.Constant(value=n) for n in names], ctx=ast.Load())


def is_generated_function(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and node.name.startswith(PREFIX)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
           ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def walk_scope(nodes: Iterable[ast.AST]):
    """Every node under ``nodes`` that belongs to the same scope (nested scopes are not entered)."""
    stack = list(nodes)[::-1]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _SCOPES):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def assigned_names(stmts: Iterable[ast.stmt]) -> set[str]:
    """Names bound by ``stmts`` in their own scope (assignments, loop targets, ``with ... as``,
    imports, user function definitions); generated helper functions are not counted."""
    names: set[str] = set()
    declared: set[str] = set()
    for node in walk_scope(stmts):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not is_generated_function(node):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared.update(node.names)
    return names - declared


def definitely_assigned(stmts: list[ast.stmt]) -> set[str]:
    """Names ``stmts`` assign on every path through them: both branches of an ``if``, never only
    inside a loop body (it may run zero times) or a ``try``."""
    out: set[str] = set()
    for stmt in stmts:
        if isinstance(stmt, ast.If):
            out |= definitely_assigned(stmt.body) & definitely_assigned(stmt.orelse)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            out |= definitely_assigned(stmt.body) | assigned_names(
                [ast.Expr(value=i.optional_vars) for i in stmt.items if i.optional_vars is not None])
        elif not isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.Try, ast.Match)):
            out |= assigned_names([stmt])
    return out


def loop_iterators(stmts: Iterable[ast.stmt]) -> set[str]:
    """The ``_jst.ForIter`` objects that ``for`` loops inside ``stmts`` create (``for_loop`` pass).

    Such a loop lies wholly inside ``stmts``, so its iterator is used nowhere else: a construct
    around the loop need not (and, as it is a Python object, cannot) carry it.
    """
    return {node.targets[0].id for node in walk_scope(stmts)
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "ForIter" and isinstance(node.value.func.value, ast.Name)
            and node.value.func.value.id == JST}


def contains(stmts: Iterable[ast.AST], kinds: tuple[type, ...], *, enter_loops: bool = True) -> bool:
    """Whether a node of ``kinds`` occurs in ``stmts`` (same scope; loops only if ``enter_loops``)."""
    stack = list(stmts)
    while stack:
        node = stack.pop()
        if isinstance(node, kinds):
            return True
        if isinstance(node, _SCOPES) or (not enter_loops and isinstance(node, (ast.For, ast.While))):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def jst_call(name: str) -> ast.Attribute:
    """The expression ``_jst.<name>``."""
    return ast.Attribute(value=ast.Name(id=JST, ctx=ast.Load()), attr=name, ctx=ast.Load())


def is_jst_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and (func.id == JST or func.id.startswith(PREFIX))


def out_of_place(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """``x += y`` -> ``x = x + y`` for plain names in ``stmts`` (same scope).

    On a tensor, ``+=`` mutates in place, and ``torch.cond`` / ``torch.while_loop`` refuse a body
    that mutates its inputs; a counter that started as a Python int is now a tensor too. The
    rebinding form gives the same value (it differs only for another name aliasing the tensor).
    """
    for node in walk_scope(stmts):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                setattr(node, field, [_rebind(s) for s in block])
    return [_rebind(s) for s in stmts]


def _rebind(stmt: ast.stmt) -> ast.stmt:
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        value = ast.BinOp(left=ast.Name(id=stmt.target.id, ctx=ast.Load()), op=stmt.op, right=stmt.value)
        new = ast.Assign(targets=[stmt.target], value=ast.copy_location(value, stmt))
        return ast.copy_location(new, stmt)
    return stmt

"""Early ``return`` -> one return at the end, fed by a variable set on every path.

Two rewrites, the first where it stays small:

1. Move what follows a returning ``if`` into its branches, so that each path ends in its own
   ``return``, then make every ``return v`` an assignment ``_jst_retval = v``::

       if x.sum() > 0:                 if x.sum() > 0:
           return x * 2        ->          _jst_retval = x * 2
       y = x - 1                       else:
       return y                            y = x - 1
                                           _jst_retval = y
                                       return _jst_retval

   Both branches of the ``if`` compute the return value, so a tensor predicate makes one
   ``torch.cond`` whose outputs come from both sides alike.
2. Where that would copy too much (the code after a return is copied once per branch of every
   enclosing ``if``: exponential in the number of nested early returns), or a return sits in a
   ``with`` / ``try``, each ``return v`` sets ``_jst_retval`` and a flag instead, and what follows
   a statement that may have returned runs under ``if not _jst_retflag`` (Paddle's return
   transformer works this way). Under a tensor condition the return value, assigned in one
   branch only, starts from a zero value of its shape (the runtime probes the branch for it).

A function that only returns at its end is left alone; a path that falls off the end returns
``None``, as in Python. ``loop_return`` has already turned returns inside loops into the flag and
value and an ``if _jst_retflag: return _jst_retval`` after the loop.
"""

from __future__ import annotations

import ast
import copy

from sampan.jit.passes.base import PassContext, contains, template
from sampan.jit.passes.loop_return import RETFLAG, RETVAL

_BLOCKS = ("body", "orelse", "finalbody")


def _needs_rewrite(body: list[ast.stmt]) -> bool:
    """Whether a return occurs anywhere but as the function's last statement."""
    return contains(body[:-1], (ast.Return,)) or (bool(body) and not isinstance(body[-1], ast.Return)
                                                  and contains(body[-1:], (ast.Return,)))


def _block(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """``stmts`` with returns turned into flag and value, and what follows a statement that may
    have returned guarded by ``if not _jst_retflag``."""
    out: list[ast.stmt] = []
    for i, stmt in enumerate(stmts):
        if isinstance(stmt, ast.Return):
            value = stmt.value if stmt.value is not None else ast.Constant(value=None)
            if not (isinstance(value, ast.Name) and value.id == RETVAL):  # loop_return set it already
                out += template(f"{RETVAL} = VALUE", stmt, VALUE=value)
            return [*out, *template(f"{RETFLAG} = True", stmt)]  # what follows a return never runs
        if not contains([stmt], (ast.Return,)):
            out.append(stmt)
            continue
        for field in _BLOCKS:
            if isinstance(getattr(stmt, field, None), list):
                setattr(stmt, field, _block(getattr(stmt, field)) or [ast.Pass()])
        for handler in getattr(stmt, "handlers", []):
            handler.body = _block(handler.body) or [ast.Pass()]
        out.append(stmt)
        rest = stmts[i + 1:]
        if rest:
            out += template(f"if not {RETFLAG}:\n    REST", rest[0], REST=_block(rest))
        return out
    return out


# The first rewrite is used while the function grows by at most this factor (counted in AST nodes).
_GROWTH = 2.0


def _size(stmts: list[ast.stmt]) -> int:
    return sum(1 for stmt in stmts for _ in ast.walk(stmt))


def _move_tails(stmts: list[ast.stmt]) -> tuple[list[ast.stmt], bool] | None:
    """Rewrite 1, first half: what follows a returning ``if`` moves into its branches; code after
    a return is dropped. (body, every path returns), or None where a return sits in another block."""
    out: list[ast.stmt] = []
    for i, stmt in enumerate(stmts):
        if isinstance(stmt, ast.Return):
            return [*out, stmt], True
        if isinstance(stmt, ast.If) and contains(stmt.body + stmt.orelse, (ast.Return,)):
            tail = stmts[i + 1:]
            body = _move_tails(stmt.body + copy.deepcopy(tail))
            orelse = _move_tails(stmt.orelse + copy.deepcopy(tail))
            if body is None or orelse is None:
                return None
            stmt.body, stmt.orelse = body[0], orelse[0]
            return [*out, stmt], body[1] and orelse[1]
        if contains([stmt], (ast.Return,)):
            return None  # a return inside a with / try: rewrite 2
        out.append(stmt)
    return out, False


def _assign(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """Rewrite 1, second half: each path's final ``return v`` -> ``_jst_retval = v`` (``None`` if
    the path has no return)."""
    last = stmts[-1] if stmts else None
    if isinstance(last, ast.Return):
        value = last.value if last.value is not None else ast.Constant(value=None)
        return [*stmts[:-1], *template(f"{RETVAL} = VALUE", last, VALUE=value)]
    if isinstance(last, ast.If) and contains(last.body + last.orelse, (ast.Return,)):
        last.body = _assign(last.body)
        last.orelse = _assign(last.orelse)
        return stmts
    like = last if last is not None else ast.Pass(lineno=1, col_offset=0)
    return [*stmts, *template(f"{RETVAL} = None", like)]


class _EarlyReturn(ast.NodeVisitor):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def visit_FunctionDef(self, node: ast.FunctionDef):
        self.generic_visit(node)  # nested user functions convert on their own
        if not _needs_rewrite(node.body):
            return
        init = template(f"{RETFLAG} = False\n{RETVAL} = None", node.body[0])
        end = template(f"return {RETVAL}", node.body[-1])
        moved = _move_tails(copy.deepcopy(node.body))
        if moved is not None and _size(moved[0]) <= _GROWTH * _size(node.body):
            node.body = [*init, *_assign(moved[0]), *end]
        else:
            node.body = [*init, *_block(node.body), *end]


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    _EarlyReturn(ctx).visit(tree)
    return tree

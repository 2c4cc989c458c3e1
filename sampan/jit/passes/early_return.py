"""Early ``return`` under an ``if`` -> one return at the end, fed by a variable set on every path.

First the statements after an ``if`` that may return move into its branches (so each path ends
in its own ``return``), then every ``return v`` becomes ``_jst_retval = v`` and the function
ends with ``return _jst_retval``::

    if x.sum() > 0:                 if x.sum() > 0:
        return x * 2        ->          _jst_retval = x * 2
    y = x - 1                       else:
    return y                            y = x - 1
                                        _jst_retval = y
                                    return _jst_retval

Both branches of the ``if`` now assign ``_jst_retval``, so a tensor predicate can become one
``torch.cond``. A path that falls off the end returns ``None``, as in Python.
"""

from __future__ import annotations

import ast
import copy

from sampan.jit.passes.base import PassContext, contains, template, walk_scope
from sampan.jit.passes.loop_return import RETVAL


def _returns_under_if(stmts: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.If) and contains(n.body + n.orelse, (ast.Return,)) for n in walk_scope(stmts))


class _EarlyReturn(ast.NodeVisitor):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def visit_FunctionDef(self, node: ast.FunctionDef):
        self.generic_visit(node)  # nested user functions convert on their own
        if not _returns_under_if(node.body):
            return
        body, _ = self._normalize(node.body)
        node.body = [*self._assign(body), *template(f"return {RETVAL}", body[-1])]

    def _normalize(self, stmts: list[ast.stmt]) -> tuple[list[ast.stmt], bool]:
        """Move what follows a returning ``if`` into its branches; drop code after a return."""
        out: list[ast.stmt] = []
        for i, stmt in enumerate(stmts):
            if isinstance(stmt, ast.Return):
                return [*out, stmt], True
            if isinstance(stmt, ast.If) and contains(stmt.body + stmt.orelse, (ast.Return,)):
                tail = stmts[i + 1:]
                stmt.body, body_returns = self._normalize(stmt.body + copy.deepcopy(tail))
                stmt.orelse, else_returns = self._normalize(stmt.orelse + copy.deepcopy(tail))
                return [*out, stmt], body_returns and else_returns
            if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and \
                    _returns_under_if([stmt]):
                raise self.ctx.error(stmt, f"a 'return' under an 'if' inside '{type(stmt).__name__.lower()}'"
                                     " cannot be converted",
                                     "Assign the result to a variable and return it after the block.")
            out.append(stmt)
        return out, False

    def _assign(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        """Turn each path's final ``return v`` into ``_jst_retval = v`` (``None`` if it has none)."""
        last = stmts[-1] if stmts else None
        if isinstance(last, ast.Return):
            value = last.value if last.value is not None else ast.Constant(value=None)
            return [*stmts[:-1], *template(f"{RETVAL} = VALUE", last, VALUE=value)]
        if isinstance(last, ast.If) and contains(last.body + last.orelse, (ast.Return,)):
            last.body = self._assign(last.body)
            last.orelse = self._assign(last.orelse)
            return stmts
        like = last if last is not None else ast.Pass(lineno=1, col_offset=0)
        return [*stmts, *template(f"{RETVAL} = None", like)]


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    _EarlyReturn(ctx).visit(tree)
    return tree

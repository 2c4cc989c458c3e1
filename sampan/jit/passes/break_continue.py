"""``break`` / ``continue`` -> flags, with the rest of the loop body guarded by them.

    while c:                        _jst_brk_1 = False
        A                           while _jst.LoopTest(_jst_brk_1, lambda: c):
        if d:              ->           if not _jst_brk_1:
            break                           A
        B                                   if d:
                                                _jst_brk_1 = True
                                            if not _jst_brk_1:
                                                B

``continue`` works the same with a flag reset at the top of each iteration. The whole body is
guarded by the break flag so that a Python loop (unrolled in the graph) whose break condition is
a tensor turns its remaining iterations into no-ops; ``LoopTest`` stops a tensor loop instead.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, contains, template
from sampan.jit.passes.for_loop import PRELUDE_ATTR


def _guard(stmts: list[ast.stmt], flag: str, kind: type) -> list[ast.stmt]:
    """Replace ``kind`` statements by ``flag = True`` and run what follows only while not set."""
    out: list[ast.stmt] = []
    for i, stmt in enumerate(stmts):
        if isinstance(stmt, kind):
            return [*out, *template(f"{flag} = True", stmt)]
        if contains([stmt], (kind,), enter_loops=False):
            for field in ("body", "orelse", "finalbody"):
                if isinstance(getattr(stmt, field, None), list):
                    setattr(stmt, field, _guard(getattr(stmt, field), flag, kind))
            for handler in getattr(stmt, "handlers", []):
                handler.body = _guard(handler.body, flag, kind)
            rest = stmts[i + 1:]
            tail = template(f"if not {flag}:\n    REST", rest[0], REST=_guard(rest, flag, kind)) if rest else []
            return [*out, stmt, *tail]
        out.append(stmt)
    return out


class _BreakContinue(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def visit_While(self, node: ast.While):
        self.generic_visit(node)  # inner loops own their own break / continue
        prelude_len = getattr(node, PRELUDE_ATTR, 0)
        prelude, body = node.body[:prelude_len], node.body[prelude_len:]
        before: list[ast.stmt] = []
        if contains(body, (ast.Continue,), enter_loops=False):
            flag = self.ctx.fresh("cont")
            body = [*template(f"{flag} = False", node), *_guard(body, flag, ast.Continue)]
        if contains(body, (ast.Break,), enter_loops=False):
            flag = self.ctx.fresh("brk")
            before = template(f"{flag} = False", node)
            body = template(f"if not {flag}:\n    BODY", node, BODY=_guard(body, flag, ast.Break))
            node.test = template(f"_jst.LoopTest({flag}, lambda: TEST)", node, TEST=node.test)[0].value
        node.body = [*prelude, *body]
        return [*before, node]


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    return _BreakContinue(ctx).visit(tree)

"""``for`` -> ``while`` over a ``_jst.ForIter``, which decides at run time how to iterate.

    for t in ITER:                  _jst_it_3 = _jst.ForIter(ITER, where)
        BODY               ->       _jst_idx_3 = _jst_it_3.start()
                                    while _jst_it_3.has_next(_jst_idx_3):
                                        t = _jst_it_3.get(_jst_idx_3)
                                        _jst_idx_3 = _jst_idx_3 + 1
                                        BODY

Python sequences (lists, ``enumerate`` / ``zip`` of them, layer lists, ``range`` of ints) give a
Python index and a Python loop, which the graph unrolls. ``range`` with tensor bounds and
iteration over a tensor give a tensor index, so the ``while`` pass makes one ``torch.while_loop``.
The two prelude statements stay outside ``break`` / ``continue`` guards (``_jst_prelude``).
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, jst_call, template

PRELUDE_ATTR = "_jst_prelude"
# The iterator of the loop a `for` became: the while_loop pass passes its bound() to _jst.While.
ITER_ATTR = "_jst_iter"


class _ForLoop(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def visit_For(self, node: ast.For):
        self.generic_visit(node)
        it, idx = self.ctx.fresh("it"), self.ctx.fresh("idx")
        iterable = node.iter
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id == "range":
            iterable.func = ast.copy_location(jst_call("Range"), iterable.func)
            iterable.keywords = [ast.keyword(arg="where", value=ast.Constant(value=self.ctx.where(node)))]
        stmts = template(
            f"{it} = _jst.ForIter(ITER, WHERE)\n"
            f"{idx} = {it}.start()\n"
            f"while {it}.has_next({idx}):\n"
            f"    TARGET = {it}.get({idx})\n"
            f"    {idx} = {idx} + 1\n"
            f"    BODY\n",
            node, ITER=iterable, WHERE=ast.Constant(value=self.ctx.where(node)), TARGET=node.target,
            BODY=node.body,
        )
        setattr(stmts[-1], PRELUDE_ATTR, 2)
        setattr(stmts[-1], ITER_ATTR, it)
        return stmts


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    return _ForLoop(ctx).visit(tree)

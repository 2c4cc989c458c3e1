"""``assert cond, msg`` -> ``_jst.Assert(cond, lambda: msg, where)``.

A Python condition asserts as usual; a tensor condition becomes a runtime check inside the graph
(``torch._assert_async``) instead of a data-dependent ``bool(tensor)``.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, template


class _Assert(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def visit_Assert(self, node: ast.Assert):
        msg = node.msg if node.msg is not None else ast.Constant(value=None)
        return template("_jst.Assert(TEST, lambda: MSG, WHERE)", node, TEST=node.test, MSG=msg,
                        WHERE=ast.Constant(value=self.ctx.where(node)))


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    return _Assert(ctx).visit(tree)

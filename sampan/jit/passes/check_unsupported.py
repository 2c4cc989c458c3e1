"""Refuse, with the user's file:line and a suggested rewrite, what no later pass can convert."""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext


class _Check(ast.NodeVisitor):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def visit_Yield(self, node):
        raise self.ctx.error(node, "a generator ('yield') cannot be converted",
                             "Collect the values in a list or tensor and return it.")

    visit_YieldFrom = visit_Yield

    def visit_Await(self, node):
        raise self.ctx.error(node, "'await' cannot be converted", "Convert a synchronous function instead.")

    def visit_Global(self, node):
        raise self.ctx.error(node, f"'{type(node).__name__.lower()} {', '.join(node.names)}' cannot be converted",
                             "Pass the value in as an argument and return the new value instead.")

    visit_Nonlocal = visit_Global

    def _loop_else(self, node):
        if node.orelse:
            kind = "for" if isinstance(node, ast.For) else "while"
            raise self.ctx.error(node, f"'{kind} ... else' cannot be converted",
                                 "Set a flag before 'break' and test it after the loop.")
        self.generic_visit(node)

    visit_For = visit_While = _loop_else


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    _Check(ctx).visit(tree)
    return tree

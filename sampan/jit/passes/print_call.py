"""``print(...)`` -> ``_jst.Print(...)``: printing tensors must not break the graph."""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, jst_call


class _Print(ast.NodeTransformer):
    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "print":
            node.func = ast.copy_location(jst_call("Print"), node.func)
        return node


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    return _Print().visit(tree)

"""``a and b`` / ``a or b`` / ``not a`` -> ``_jst.And(a, lambda: b)`` / ``_jst.Or`` / ``_jst.Not``.

At run time Python values keep Python's short-circuit semantics; a tensor operand becomes
``torch.logical_and`` / ``logical_or`` / ``logical_not``, so a predicate such as
``i < n and not done.all()`` stays one tensor inside the graph.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, jst_call


class _Logical(ast.NodeTransformer):
    def visit_BoolOp(self, node: ast.BoolOp):
        self.generic_visit(node)
        name = "And" if isinstance(node.op, ast.And) else "Or"
        result = node.values[-1]
        for value in reversed(node.values[:-1]):
            lazy = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[],
                                                 defaults=[]), body=result)
            result = ast.Call(func=jst_call(name), args=[value, lazy], keywords=[])
            ast.copy_location(lazy, node)
            ast.copy_location(result, node)
        return result

    def visit_UnaryOp(self, node: ast.UnaryOp):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return ast.copy_location(ast.Call(func=jst_call("Not"), args=[node.operand], keywords=[]), node)
        return node


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    tree = _Logical().visit(tree)
    ast.fix_missing_locations(tree)
    return tree

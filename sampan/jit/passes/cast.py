"""``.item()`` / ``float(t)`` / ``int(t)`` / ``bool(t)`` in a condition -> ``_jst.Item`` / ``Float``
/ ``Int`` / ``Bool``, which keep a tensor a tensor.

``if x.sum().item() > 0:`` asks a tensor for a Python number, which ends the graph (torch.compile)
or fails (torch.export: a data-dependent guard). In the test of an ``if`` / ``elif`` / ``while``
/ ``a if c else b`` / ``assert`` the converters return a 0-d tensor instead (float64 for floating
values, the precision of a Python float; ``int`` truncates toward zero), so the comparison stays
a tensor predicate and the ``if`` becomes a ``torch.cond``. Python values convert as before.
Outside conditions these calls are left alone (their result may be used as a Python number).
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, jst_call

_BUILTINS = {"float": "Float", "int": "Int", "bool": "Bool"}


class _CastInTest(ast.NodeTransformer):
    """Rewrites the casts of one condition expression (not inside lambdas or comprehensions)."""

    def __init__(self, where: str):
        self.where = where

    def visit_Lambda(self, node):
        return node

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_Lambda

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        where = ast.Constant(value=self.where)
        func = node.func
        if (isinstance(func, ast.Attribute) and func.attr == "item" and not node.args and not node.keywords):
            return ast.copy_location(ast.Call(func=jst_call("Item"), args=[func.value, where], keywords=[]), node)
        if (isinstance(func, ast.Name) and func.id in _BUILTINS and len(node.args) == 1 and not node.keywords
                and not isinstance(node.args[0], ast.Starred)):
            return ast.copy_location(ast.Call(func=jst_call(_BUILTINS[func.id]), args=[node.args[0], where],
                                              keywords=[]), node)
        return node


class _Cast(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def _test(self, node):
        self.generic_visit(node)
        node.test = _CastInTest(self.ctx.where(node)).visit(node.test)
        return node

    visit_If = visit_While = visit_IfExp = visit_Assert = _test


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    tree = _Cast(ctx).visit(tree)
    ast.fix_missing_locations(tree)
    return tree

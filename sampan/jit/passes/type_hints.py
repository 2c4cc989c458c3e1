"""Type hints -> removed (the converted function runs without them).

Annotations are evaluated when the converted function is built, outside the module's
``from __future__ import annotations``, so a hint naming a type imported only for type checking
would fail there; and ``y: int`` without a value inside a converted branch would make ``y`` a
local with no value in the generated branch function. Hints change nothing at run time, so
``x: T = v`` becomes ``x = v``, ``x: T`` goes, and parameters and returns lose their annotations.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext


class _TypeHints(ast.NodeTransformer):
    def visit_FunctionDef(self, node: ast.FunctionDef):
        self.generic_visit(node)
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if arg is not None:
                arg.annotation = None
        node.returns = None
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign):
        if node.value is None:
            return ast.copy_location(ast.Pass(), node)
        return ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node)


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    tree = _TypeHints().visit(tree)
    ast.fix_missing_locations(tree)
    return tree

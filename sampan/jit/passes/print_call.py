"""``print(...)`` statements -> ``_jst_printed = _jst.Print(_jst_printed, where, ...)``.

Printing tensors must not break the graph, and under a tensor condition it must happen only
when the branch runs (``sampan.jit.printing``). Inside a ``cond`` branch or a ``while_loop`` body
the print is an op whose 0-d token output is assigned to ``_jst_printed``: the control flow passes
then carry the token like any variable, which keeps the op in the graph. The token starts as
``0`` at the top of the function.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, jst_call, template

TOKEN = "_jst_printed"


def _is_print(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == "print")


class _Print(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx
        self.found: list[bool] = []

    def visit_FunctionDef(self, node: ast.FunctionDef):
        self.found.append(False)
        self.generic_visit(node)
        if self.found.pop():
            node.body = [*template(f"{TOKEN} = 0", node.body[0]), *node.body]
        return node

    def visit_Expr(self, node: ast.Expr):
        self.generic_visit(node)
        if not _is_print(node) or not self.found:
            return node
        self.found[-1] = True
        call = node.value
        call.func = ast.copy_location(jst_call("Print"), call.func)
        call.args = [ast.Name(id=TOKEN, ctx=ast.Load()), ast.Constant(value=self.ctx.where(node)), *call.args]
        assign = ast.Assign(targets=[ast.Name(id=TOKEN, ctx=ast.Store())], value=call)
        return ast.copy_location(assign, node)


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    tree = _Print(ctx).visit(tree)
    ast.fix_missing_locations(tree)
    return tree

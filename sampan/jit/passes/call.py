"""Calls to the user's own functions -> calls to their converted versions.

``helper(x)`` or ``self.block(x)`` may hide tensor control flow one level down; the translator
resolves the callee when the function is converted (it sees the globals and closure), converts
it (cached per function) and the call site calls the converted function through a generated
free variable. Library code (torch, builtins) and callables without Python source are left as
they are. Layers reached from here are converted in place (their ``forward`` is replaced).
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, is_jst_call


class _Call(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        if is_jst_call(node) or self.ctx.resolve_call is None:
            return node
        converted = self.ctx.resolve_call(node.func)
        if converted is None:
            return node
        name = self.ctx.fresh("fn")
        self.ctx.bindings[name] = converted
        if isinstance(node.func, ast.Attribute):  # self.method(x) -> converted_method(self, x)
            node.args = [node.func.value, *node.args]
        node.func = ast.copy_location(ast.Name(id=name, ctx=ast.Load()), node.func)
        return node


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    return _Call(ctx).visit(tree)

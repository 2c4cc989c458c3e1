"""Give every name that converted control flow carries a placeholder at the top of its function.

``(y,) = _jst.IfElse(..., (y,), ...)`` reads ``y`` before the ``if`` even when the user's code
first assigns it inside a branch. ``y = _jst.UndefinedVar('y')`` at the top of the function makes
that read legal; the placeholder raises a clear error if the user's code ever uses it, where
Python would have raised ``UnboundLocalError``.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, assigned_names, is_generated_function, template


class _UndefinedVars(ast.NodeVisitor):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def visit_FunctionDef(self, node: ast.FunctionDef):
        self.generic_visit(node)
        if is_generated_function(node):
            return  # its carried names are its parameters
        args = node.args
        params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
        params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        names = sorted((assigned_names(node.body) & self.ctx.carried) - params)
        if names:
            inits = [s for n in names for s in template(f"{n} = _jst.UndefinedVar({n!r})", node.body[0])]
            node.body = [*inits, *node.body]


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    _UndefinedVars(ctx).visit(tree)
    return tree

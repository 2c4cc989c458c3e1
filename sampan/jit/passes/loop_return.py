"""``return`` inside a loop -> set the return value and a flag, ``break``, return after the loop.

    while c:                    _jst_retflag = False
        if d:                   while c:
            return x     ->         if d:
        ...                             _jst_retval = x; _jst_retflag = True; break
                                    ...
                                if _jst_retflag:
                                    return _jst_retval

The ``break`` is then handled by ``break_continue`` and the ``if`` after the loop by
``early_return``. With a tensor loop condition the return value cannot leave the graph loop
(it has no value before the loop); the runtime then says so and suggests the rewrite.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, contains, template

RETVAL = "_jst_retval"
RETFLAG = "_jst_retflag"


class _ReplaceReturns(ast.NodeTransformer):
    """Rewrite the returns of one loop body (not those in nested functions)."""

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = visit_FunctionDef

    def visit_Return(self, node: ast.Return):
        value = node.value if node.value is not None else ast.Constant(value=None)
        return template(f"{RETVAL} = VALUE\n{RETFLAG} = True\nbreak", node, VALUE=value)


class _LoopReturn(ast.NodeTransformer):
    def _loop(self, node):
        self.generic_visit(node)  # inner loops first: their returns become this loop's returns
        if not contains(node.body, (ast.Return,)):
            return node
        node.body = [_ReplaceReturns().visit(s) for s in node.body]
        node.body = [s for stmt in node.body for s in (stmt if isinstance(stmt, list) else [stmt])]
        before = template(f"{RETFLAG} = False\n{RETVAL} = None", node)
        after = template(f"if {RETFLAG}:\n    return {RETVAL}", node)
        return [*before, node, *after]

    visit_For = visit_While = _loop


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    return _LoopReturn().visit(tree)

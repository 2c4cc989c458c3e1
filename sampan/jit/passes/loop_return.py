"""``return`` inside a loop -> set the return value and a flag, ``break``, return after the loop.

    for i in ...:                   for i in ...:
        if d:              ->           if d:
            return x * i                    _jst_retval = x * i; _jst_retflag = True; break
        ...                             ...
    return y                        if _jst_retflag:
                                        return _jst_retval
                                    return y

A ``return`` at any depth works: in nested loops the inner loop's ``if _jst_retflag: return
_jst_retval`` is itself a return inside the outer loop, rewritten the same way (inner loops are
rewritten first). The ``break`` is then handled by ``break_continue``, and the returns after the
loop by ``early_return``, which also sets the flag and value once at the top of the function (so
an inner loop does not reset what an outer loop carries). Under a tensor loop condition the
return value has no value before the loop; the runtime probes the loop body for its shape and
carries it from zeros (``_jst.While``), and the flag decides after the loop which return is taken.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, contains, template

# The runtime converters (sampan/jit/runtime/) recognise both by this prefix: a probe gives them
# a starting value when they first appear inside tensor control flow.
RETURN_PREFIX = "_jst_ret"
RETVAL = RETURN_PREFIX + "val"
RETFLAG = RETURN_PREFIX + "flag"


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
        return [node, *template(f"if {RETFLAG}:\n    return {RETVAL}", node)]

    visit_For = visit_While = _loop


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    return _LoopReturn().visit(tree)

"""``lst.append(v)`` -> ``lst = _jst.Append(lst, v, where)``; ``torch.stack`` / ``torch.cat`` /
``len`` of a list -> ``_jst.Stack`` / ``_jst.Cat`` / ``_jst.Len`` (Paddle: lists as tensor arrays).

Appending to a Python list inside a ``torch.cond`` branch or a ``torch.while_loop`` body is a side
effect no graph can hold. Written as an assignment, the list becomes a value the converted control
flow carries: under a tensor condition the runtime turns it into a
:class:`~sampan.jit.tensor_array.TensorArray` (a buffer plus a count), or, when both branches of
an ``if`` append the same number of same-shaped tensors, makes the new elements outputs of the
``cond``. Outside tensor control flow ``Append`` appends in place, exactly as ``list.append``.

``torch.stack(lst)`` and friends take either form; ``return lst`` of a list that became a tensor
array is refused with a message (``_jst.ListValue``): its length is known only when the graph runs.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext, jst_call, walk_scope

_TORCH_CALLS = {"stack": "Stack", "cat": "Cat", "concat": "Cat", "concatenate": "Cat"}


def _appended(body: list[ast.stmt]) -> set[str]:
    """Names of lists this function appends to (``name.append(...)`` statements, same scope)."""
    return {n.value.func.value.id for n in walk_scope(body)
            if isinstance(n, ast.Expr) and _is_append(n.value)}


def _is_append(node: ast.expr) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append"
            and isinstance(node.func.value, ast.Name) and len(node.args) == 1 and not node.keywords
            and not isinstance(node.args[0], ast.Starred))


class _ListAppend(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx
        self.lists: list[set[str]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef):
        self.lists.append(_appended(node.body))
        try:
            return self.generic_visit(node)
        finally:
            self.lists.pop()

    def _where(self, node: ast.AST) -> ast.Constant:
        return ast.Constant(value=self.ctx.where(node))

    def visit_Expr(self, node: ast.Expr):
        self.generic_visit(node)
        if not _is_append(node.value):
            return node
        name = node.value.func.value.id
        call = ast.Call(func=jst_call("Append"), args=[ast.Name(id=name, ctx=ast.Load()), node.value.args[0],
                                                        self._where(node)], keywords=[])
        return ast.copy_location(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=call), node)

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        func = node.func
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "torch"
                and func.attr in _TORCH_CALLS and node.args):
            node.func = ast.copy_location(jst_call(_TORCH_CALLS[func.attr]), func)
        elif isinstance(func, ast.Name) and func.id == "len" and len(node.args) == 1 and not node.keywords:
            node.func = ast.copy_location(jst_call("Len"), func)
        return node

    def visit_Return(self, node: ast.Return):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and self.lists and node.value.id in self.lists[-1]:
            node.value = ast.copy_location(ast.Call(func=jst_call("ListValue"),
                                                    args=[node.value, self._where(node)], keywords=[]), node)
        return node


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    tree = _ListAppend(ctx).visit(tree)
    ast.fix_missing_locations(tree)
    return tree

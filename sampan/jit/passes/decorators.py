"""The function's decorators -> taken off its definition, to be re-applied to the converted function.

``@to_static`` in any spelling (``@to_static``, ``@paddle.jit.to_static(input_spec=...)``) is
dropped: the function is being converted already. Every other decorator (``@torch.no_grad()``,
``@functools.wraps(f)``, the user's own) is kept in ``ctx.decorators``; the translator evaluates
them where the function was defined and applies them, innermost first, to the converted
function, so that it behaves as the decorated original did. A function wrapped by a library
decorator is converted from the function inside the wrapper (``inspect.unwrap``).
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import PassContext

_DROPPED = {"to_static"}


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    funcdef = tree.body[0]
    ctx.decorators = [d for d in funcdef.decorator_list if _name(d) not in _DROPPED]
    funcdef.decorator_list = []
    return tree

"""``while`` -> ``_jst.While(cond_fn, body_fn, values, names, where)``.

    while i < n:                    def _jst_cond_5(i, x):
        x = x * 2                       return i < n
        i = i + 1          ->       def _jst_body_5(i, x):
                                        x = x * 2
                                        i = i + 1
                                        return (i, x)
                                    (i, x) = _jst.While(_jst_cond_5, _jst_body_5, (i, x), ('i', 'x'), where)

The runtime loops in Python while the condition is a Python value (the graph unrolls it) and
makes one ``torch.while_loop`` once it is a tensor. The loop carries the names the body assigns;
those with no value before the loop are local to one iteration. A loop that was a ``for`` also
passes ``bound=<iterator>.bound()``, the most iterations it can run (for a list appended inside).
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import (
    PassContext,
    assigned_names,
    expr,
    loop_iterators,
    names_tuple,
    out_of_place,
    strings_tuple,
    template,
)
from sampan.jit.passes.for_loop import ITER_ATTR


class _While(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def visit_While(self, node: ast.While):
        self.generic_visit(node)
        names = sorted(assigned_names(node.body) - loop_iterators(node.body))
        self.ctx.carried.update(names)
        cond_fn, body_fn = self.ctx.fresh("cond"), self.ctx.fresh("body")
        params = ", ".join(names)
        stmts = template(
            f"def {cond_fn}({params}):\n    return TEST\n"
            f"def {body_fn}({params}):\n    BODY\n    return ({params}{',' if len(names) == 1 else ''})\n",
            node, TEST=node.test, BODY=out_of_place(node.body),
        )
        call = template(f"_jst.While({cond_fn}, {body_fn}, ARGS, NAMES, WHERE)", node,
                        ARGS=names_tuple(names), NAMES=strings_tuple(names),
                        WHERE=ast.Constant(value=self.ctx.where(node)))[0]
        it = getattr(node, ITER_ATTR, None)
        if it is not None:
            call.value.keywords = [ast.keyword(arg="bound", value=expr(f"{it}.bound()", node))]
        if names:
            call = ast.copy_location(ast.Assign(targets=[names_tuple(names, ast.Store)], value=call.value), node)
        return [*stmts, call]


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    tree = _While(ctx).visit(tree)
    ast.fix_missing_locations(tree)
    return tree

"""``if`` / ``elif`` / ``else`` and ``a if c else b`` -> ``_jst.IfElse`` / ``_jst.IfExp``.

Each branch becomes a function of the names either branch assigns, returning their new values::

    if pred:                        def _jst_true_4(y, t):
        t = x * 2                       t = x * 2
        y = t + 1          ->           y = t + 1
    else:                               return (y, t)
        y = -x                      def _jst_false_4(y, t):
                                        y = -x
                                        return (y, t)
                                    (y, t) = _jst.IfElse(pred, _jst_true_4, _jst_false_4, (y, t),
                                                         ('y', 't'), ('y',), where)

The runtime runs one branch for a Python predicate and makes a ``torch.cond`` for a tensor one.
The names assigned in *both* branches are listed too: under a tensor predicate such a name is an
output even if it had no value before the ``if``, while a name assigned in only one branch and
undefined before stays local to that branch (using it after the ``if`` is a clear error).
Inner ``if``s convert first, so ``elif`` chains and nesting need nothing special.

An ``if`` inside a loop whose branches only compute (no loop, ``assert``, ``print``, ``raise`` or
call of a converted user function) is marked ``select=True``: when exported, it may run both
branches and pick the results with ``torch.where`` (see ``_jst.IfElse``), because the torch 2.13
ONNX exporter cannot export an ``If`` inside a ``Loop``.
"""

from __future__ import annotations

import ast

from sampan.jit.passes.base import (
    JST,
    PREFIX,
    PassContext,
    assigned_names,
    contains,
    definitely_assigned,
    loop_iterators,
    names_tuple,
    out_of_place,
    strings_tuple,
    template,
)

_EFFECTS = ("Assert", "Print", "While")


def _selectable(stmts: list[ast.stmt]) -> bool:
    """Whether running these statements when their branch is not taken changes nothing but the
    values they compute (so both branches of a tensor ``if`` may run, their results selected)."""
    for node in (n for stmt in stmts for n in ast.walk(stmt)):
        if isinstance(node, (ast.While, ast.For, ast.Raise, ast.Yield, ast.YieldFrom, ast.Await)):
            return False
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == JST:
                if func.attr in _EFFECTS:
                    return False
            elif isinstance(func, ast.Name) and (func.id == "print" or func.id.startswith(PREFIX + "fn_")):
                return False
    return True


class _IfElse(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx
        self.loop_depth = 0

    def visit_While(self, node: ast.While):
        self.loop_depth += 1
        try:
            return self.generic_visit(node)
        finally:
            self.loop_depth -= 1

    def _select(self, stmts: list[ast.stmt]) -> list[ast.keyword]:
        if self.loop_depth and _selectable(stmts):
            return [ast.keyword(arg="select", value=ast.Constant(value=True))]
        return []

    def visit_If(self, node: ast.If):
        # Before the inner ifs are converted (their generated assignments would count as
        # definite): names each branch assigns on every path through it.
        definite = definitely_assigned(node.body) & definitely_assigned(node.orelse)
        self.generic_visit(node)
        if contains(node.body + node.orelse, (ast.Return,)):
            raise self.ctx.error(node, "a 'return' inside this 'if' could not be moved out of it",
                                 "Assign the result to a variable and return it after the 'if'.")
        inner = loop_iterators(node.body + node.orelse)
        in_body, in_else = assigned_names(node.body) - inner, assigned_names(node.orelse) - inner
        names = sorted(in_body | in_else)
        self.ctx.carried.update(names)
        true_fn, false_fn = self.ctx.fresh("true"), self.ctx.fresh("false")
        params = ", ".join(names)
        ret = f"return ({params}{',' if len(names) == 1 else ''})"
        stmts = template(
            f"def {true_fn}({params}):\n    BODY\n    {ret}\n"
            f"def {false_fn}({params}):\n    ORELSE\n    {ret}\n",
            node, BODY=out_of_place(node.body), ORELSE=out_of_place(node.orelse) or [ast.Pass()],
        )
        call = template(f"_jst.IfElse(TEST, {true_fn}, {false_fn}, ARGS, NAMES, BOTH, WHERE)", node,
                        TEST=node.test, ARGS=names_tuple(names), NAMES=strings_tuple(names),
                        BOTH=strings_tuple(sorted(in_body & in_else)),
                        WHERE=ast.Constant(value=self.ctx.where(node)))[0]
        call.value.keywords = self._select(node.body + node.orelse)
        maybe = sorted((in_body & in_else) - definite)
        if maybe:  # assigned in both branches, but not on every path of them: the run decides
            call.value.keywords.append(ast.keyword(arg="maybe", value=strings_tuple(maybe)))
        if names:
            call = ast.copy_location(ast.Assign(targets=[names_tuple(names, ast.Store)], value=call.value), node)
        return [*stmts, call]

    def visit_IfExp(self, node: ast.IfExp):
        self.generic_visit(node)
        call = template("_jst.IfExp(TEST, lambda: BODY, lambda: ORELSE, WHERE)", node, TEST=node.test,
                        BODY=node.body, ORELSE=node.orelse,
                        WHERE=ast.Constant(value=self.ctx.where(node)))[0].value
        call.keywords = self._select([ast.Expr(value=node.body), ast.Expr(value=node.orelse)])
        return call


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    tree = _IfElse(ctx).visit(tree)
    ast.fix_missing_locations(tree)
    return tree

"""``x[i]`` / ``x[i] = v`` / ``x[i] += v`` with a computed index -> ``_jst.GetItem`` / ``_jst.SetItem``.

When ``i`` is a 0-d integer tensor (a loop-carried index, ``argmax``), Python indexing asks it for
its integer value, which a graph loop does not have: torch.export fails deep inside with "Could
not extract specialized integer from data-dependent expression u0". The runtime converters read
with ``index_select`` and write with an out-of-place ``index_put`` instead (``sampan.jit.indexing``)
and index as usual otherwise::

    y = x[j, 1:]          ->    y = _jst.GetItem(x, (j, slice(1, None)), where)
    x[j] = v              ->    x = _jst.SetItem(x, j, v, where)

Indices that are constants (``x[0]``, ``x[:, None]``, ``x[..., 1:3]``) cannot be tensors and are
left alone. The write rebinds ``x`` (it is then carried by converted control flow like any
assignment); with a Python index the update is still made in place, as in Python.
"""

from __future__ import annotations

import ast
import copy

from sampan.jit.passes.base import PassContext, jst_call


def _static(index: ast.expr) -> bool:
    """Whether an index is built from constants only (so it can never be a tensor)."""
    if isinstance(index, ast.Constant):
        return True
    if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
        return _static(index.operand)
    if isinstance(index, ast.Slice):
        return all(part is None or _static(part) for part in (index.lower, index.upper, index.step))
    if isinstance(index, ast.Tuple):
        return all(_static(e) for e in index.elts)
    return False


def _index_value(index: ast.expr) -> ast.expr:
    """The index as an expression: slices become ``slice(...)`` calls (valid outside brackets)."""
    if isinstance(index, ast.Slice):
        parts = [p if p is not None else ast.Constant(value=None) for p in (index.lower, index.upper, index.step)]
        call = ast.Call(func=ast.Name(id="slice", ctx=ast.Load()), args=parts, keywords=[])
        return ast.copy_location(call, index)
    if isinstance(index, ast.Tuple):
        return ast.copy_location(ast.Tuple(elts=[_index_value(e) for e in index.elts], ctx=ast.Load()), index)
    return index


class _TensorIndex(ast.NodeTransformer):
    def __init__(self, ctx: PassContext):
        self.ctx = ctx

    def _get(self, value: ast.expr, index: ast.expr, like: ast.AST) -> ast.Call:
        call = ast.Call(func=jst_call("GetItem"),
                        args=[value, _index_value(index), ast.Constant(value=self.ctx.where(like))], keywords=[])
        return ast.copy_location(call, like)

    def visit_Subscript(self, node: ast.Subscript):
        self.generic_visit(node)
        if not isinstance(node.ctx, ast.Load) or _static(node.slice):
            return node
        return self._get(node.value, node.slice, node)

    def _set(self, target: ast.Subscript, value: ast.expr, like: ast.stmt) -> ast.stmt:
        name = target.value.id
        call = ast.Call(func=jst_call("SetItem"),
                        args=[ast.Name(id=name, ctx=ast.Load()), _index_value(target.slice), value,
                              ast.Constant(value=self.ctx.where(like))], keywords=[])
        assign = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=call)
        return ast.copy_location(assign, like)

    @staticmethod
    def _convertible(target: ast.expr) -> bool:
        return (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
                and not _static(target.slice))

    def visit_Assign(self, node: ast.Assign):
        self.generic_visit(node)
        if len(node.targets) == 1 and self._convertible(node.targets[0]):
            return self._set(node.targets[0], node.value, node)
        return node

    def visit_AugAssign(self, node: ast.AugAssign):
        target = node.target
        self.generic_visit(node)
        if not self._convertible(target):
            return node
        current = self._get(ast.Name(id=target.value.id, ctx=ast.Load()), copy.deepcopy(target.slice), node)
        value = ast.copy_location(ast.BinOp(left=current, op=node.op, right=node.value), node)
        return self._set(target, value, node)


def apply(tree: ast.Module, ctx: PassContext) -> ast.Module:
    tree = _TensorIndex(ctx).visit(tree)
    ast.fix_missing_locations(tree)
    return tree

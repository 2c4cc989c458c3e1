"""Workarounds for torch bugs that converted code would otherwise hit (applied on import).

``torch.while_loop`` backward (torch 2.13): ``WhileLoopAutogradOp.backward`` rebuilds each
iteration's inputs and marks them ``requires_grad`` only if the loop's *initial* value did. A
carried accumulator that starts as a constant (``acc = torch.zeros(3)``) therefore gets no
gradient path through the iterations: the gradient reaching it from the loop's output is dropped
after the last iteration, and every tensor that feeds ``acc`` in every iteration (a loop-invariant
``x`` in ``acc = acc + x * i``) receives only the last iteration's share (``dx = 4`` instead of
``10`` for ``i < 5``). Marking every floating-point carry as differentiable when the backward
runs restores the chain rule through all iterations; a gradient computed for an initial value
that did not require one is ignored by autograd, so nothing else changes.

``torch.cond`` backward (torch 2.13): with an integer or bool output (a ``break`` flag, a counter)
next to floating-point ones, autograd hands ``CondAutogradOp.backward`` one gradient per output
while the branches' joint graphs expect one per floating-point output ("outs_to_grad length (1) !=
tangents length (3)"). The fix records which outputs are floating point and passes only their
gradients on (integer outputs have none).

(``sampan.jit.runtime.while_loop`` works around a third one where it builds the loop: a
``while_loop`` that runs zero times still back-propagates one iteration.)

ONNX export of nested control flow (torch 2.13 + onnxscript 0.7.2): a ``cond`` inside a
``while_loop`` body (an ``If`` inside a ``Loop``), or many control-flow ops in one program, fails
in the exporter's final opset conversion with "Opset mismatch when inlining function
'pkg.torch.__subgraph__::while_loop_body_graph_0': domain 'pkg.torch.__subgraph__' has version 20
in the model but version 1 in the function". The subgraph functions import their own domain at a
version that differs from the model's, and the inliner insists they agree; the version of that
private domain means nothing. :func:`onnx_subgraph_opsets` aligns each function's imports with
the model's before the conversion runs (used by ``jit.save`` around ``torch.onnx.export``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Iterator

import torch

_FIXED = "_sampan_carries_require_grad"


def _fix_while_loop_backward() -> None:
    # torch._higher_order_ops re-exports the function while_loop under the module's name, so the
    # module is imported by its full path.
    module = importlib.import_module("torch._higher_order_ops.while_loop")
    op = getattr(module, "WhileLoopAutogradOp", None)
    if op is None or getattr(op.backward, _FIXED, False):
        return
    original = op.backward

    @functools.wraps(original)
    def backward(ctx, *grads):
        ctx.carries = tuple(
            c.detach().requires_grad_() if isinstance(c, torch.Tensor) and c.is_floating_point() and not c.requires_grad
            else c
            for c in ctx.carries)
        return original(ctx, *grads)

    setattr(backward, _FIXED, True)
    op.backward = staticmethod(backward)


def _fix_cond_backward() -> None:
    module = importlib.import_module("torch._higher_order_ops.cond")
    op = getattr(module, "CondAutogradOp", None)
    if op is None or getattr(op.backward, _FIXED, False):
        return
    forward, backward = op.forward, op.backward

    @functools.wraps(forward)
    def fixed_forward(ctx, *args):
        outs = forward(ctx, *args)
        ctx._sampan_float_outputs = [isinstance(o, torch.Tensor) and o.is_floating_point() for o in outs]
        return outs

    @functools.wraps(backward)
    def fixed_backward(ctx, *grads):
        mask = getattr(ctx, "_sampan_float_outputs", None)
        if mask is not None and not all(mask):
            grads = tuple(g for g, keep in zip(grads, mask, strict=True) if keep)
        return backward(ctx, *grads)

    setattr(fixed_backward, _FIXED, True)
    op.forward, op.backward = staticmethod(fixed_forward), staticmethod(fixed_backward)


@contextlib.contextmanager
def onnx_subgraph_opsets() -> Iterator[None]:
    """While active, ``torch.onnx.export`` aligns the opset imports of the exported program's
    functions with the model's before converting versions (see the module docstring)."""
    try:
        core = importlib.import_module("torch.onnx._internal.exporter._core")
        apis = core.onnxscript_apis
        original = apis.convert_version
    except (ImportError, AttributeError):  # another torch: nothing to patch, nothing to fix
        yield
        return

    @functools.wraps(original)
    def convert_version(model, *args, **kwargs):
        for function in model.functions.values():
            for domain, version in list(function.opset_imports.items()):
                if model.opset_imports.get(domain, version) != version:
                    function.opset_imports[domain] = model.opset_imports[domain]
        return original(model, *args, **kwargs)

    apis.convert_version = convert_version
    try:
        yield
    finally:
        apis.convert_version = original


_fix_while_loop_backward()
_fix_cond_backward()

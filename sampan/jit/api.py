"""``to_static``: the decorator and function that turn eager code into a static graph."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from sampan.jit.static_function import StaticFunction
from sampan.jit.translator import convert_layer
from sampan.static import InputSpec


def to_static(function_or_layer: Callable | nn.Module | None = None, input_spec: Sequence[InputSpec] | None = None,
              full_graph: bool = True, backend: str | Callable = "inductor") -> Any:
    """Convert Python control flow on tensors to graph control flow and compile the result.

    Usable as ``@to_static``, ``@to_static(input_spec=[...])`` or ``to_static(layer)``. On a
    function it returns a :class:`StaticFunction`; on a layer it converts ``forward`` (and the
    forwards of its sub-layers) in place and returns the layer, whose ``forward`` is then the
    StaticFunction.

    Args:
        function_or_layer: a Python function, a method, or a ``torch.nn.Module``.
        input_spec: one :class:`~sampan.static.InputSpec` per tensor argument; ``None`` in a
            shape makes that dimension dynamic (one graph for every size).
        full_graph: compile with ``fullgraph=True`` (a graph break is an error naming the line).
        backend: the ``torch.compile`` backend ("inductor"; "eager" / "aot_eager" compile fast and
            still prove one graph).
    """
    if function_or_layer is None:
        return lambda f: to_static(f, input_spec=input_spec, full_graph=full_graph, backend=backend)
    if isinstance(function_or_layer, nn.Module):
        layer = function_or_layer
        forward = layer.forward
        if isinstance(forward, StaticFunction):
            return layer
        convert_layer(layer)
        layer.forward = StaticFunction(type(layer).forward, input_spec, full_graph, backend, instance=layer)
        return layer
    return StaticFunction(function_or_layer, input_spec, full_graph, backend)


def not_to_static(function: Callable) -> Callable:
    """Mark ``function`` so that converted callers call it as it is (it is never converted)."""
    function._jst_not_to_static = True
    return function

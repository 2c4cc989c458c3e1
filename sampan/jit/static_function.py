"""``StaticFunction``: a converted function run through ``torch.compile``, with its statistics.

One ``torch.compile`` wrapper serves every input spec: dynamo keeps one graph per spec (guarded
by shapes and dtypes), and a counting backend tells a new graph from a reused one. Dimensions
that an ``InputSpec`` marks ``None`` are marked dynamic, so one graph serves all their sizes.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from sampan.jit.diagnose import dy2static_errors, to_dy2static
from sampan.jit.errors import GraphBreakError
from sampan.jit.probe import remove_probe_nodes
from sampan.jit.translator import ConvertedFunction, convert_function, convert_layer, original_forwards
from sampan.static import InputSpec


def _graph_break_count() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


class StaticFunction:
    """The callable ``to_static`` returns for a function (or puts on a layer as its ``forward``).

    Attributes:
        input_spec: the specs given to ``to_static`` (``None`` dimensions are dynamic), or None.
        last_specs: the specs of the tensor arguments of the last call (used by ``jit.save``).
    """

    def __init__(self, function: Callable, input_spec: Sequence[InputSpec] | None = None,
                 full_graph: bool = True, backend: str | Callable = "inductor", instance: Any = None):
        if isinstance(function, types.MethodType):
            function, instance = function.__func__, function.__self__
        if not isinstance(function, types.FunctionType):
            raise TypeError(f"to_static converts Python functions and Layers, got {type(function).__name__}")
        self._function = function
        self._instance = instance
        self.input_spec = list(input_spec) if input_spec is not None else None
        for spec in self.input_spec or []:
            if not isinstance(spec, InputSpec):
                raise TypeError(f"input_spec entries must be sampan.static.InputSpec, got {type(spec).__name__}")
        self.full_graph = full_graph
        self.backend = backend
        self._converted: ConvertedFunction | None = None
        self._compiled: Callable | None = None
        self._stats = {"compiles": 0, "graph_breaks": 0, "cache_hits": 0, "calls": 0}
        self._specs_seen: set[tuple] = set()
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.last_specs: list[InputSpec] | None = None
        self.last_args: tuple | None = None
        functools.update_wrapper(self, function)

    # --- conversion ------------------------------------------------------------------------------
    def _convert(self) -> ConvertedFunction:
        if self._converted is None:
            self_type = type(self._instance) if self._instance is not None else None
            if isinstance(self._instance, nn.Module):
                convert_layer(self._instance)
            self._converted = convert_function(self._function, self_type)
        return self._converted

    @property
    def code(self) -> str:
        """The final transformed source of the function."""
        return self._convert().code

    @property
    def dygraph_function(self) -> Callable:
        """The original (unconverted) function, bound like this one."""
        fn = self._function
        return fn if self._instance is None else types.MethodType(fn, self._instance)

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        """Run the converted function without ``torch.compile`` (the runtime converters still
        make ``torch.cond`` / ``torch.while_loop`` for tensor predicates)."""
        return self._target()(*args, **kwargs)

    def _target(self) -> Callable:
        fn = self._convert().function
        return fn if self._instance is None else types.MethodType(fn, self._instance)

    def __get__(self, instance: Any, owner: type | None = None) -> StaticFunction:
        # @to_static on a method: one StaticFunction per instance, each with its own cache.
        if instance is None or self._instance is not None:
            return self
        bound = self._bound.get(instance)
        if bound is None:
            bound = StaticFunction(self._function, self.input_spec, self.full_graph, self.backend, instance)
            self._bound[instance] = bound
        return bound

    # --- execution -------------------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """``compiles`` (graphs built), ``graph_breaks``, ``cache_hits`` (calls that reused a graph)
        and ``calls``."""
        return dict(self._stats)

    def _backend(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self._stats["compiles"] += 1
        remove_probe_nodes(gm)  # what probes of branches and loop bodies recorded is unused
        backend = torch._dynamo.lookup_backend(self.backend) if isinstance(self.backend, str) else self.backend
        return backend(gm, example_inputs)

    def _compile(self) -> Callable:
        if self._compiled is None:
            dynamic = None if self.input_spec and any(s.dynamic_dims for s in self.input_spec) else False
            self._compiled = torch.compile(self._target(), backend=self._backend, fullgraph=self.full_graph,
                                           dynamic=dynamic)
        return self._compiled

    def _record_specs(self, args: tuple) -> tuple:
        specs = []
        for i, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor):
                continue
            given = self.input_spec[i] if self.input_spec and i < len(self.input_spec) else None
            if given is not None:
                if not given.matches(arg):
                    raise ValueError(f"argument {i} of {self.__qualname__} is {arg.dtype} {list(arg.shape)}, "
                                     f"which does not fit its InputSpec {given}")
                for dim in given.dynamic_dims:
                    torch._dynamo.mark_dynamic(arg, dim)
                specs.append(InputSpec(given.shape, arg.dtype, given.name))
            else:
                specs.append(InputSpec.from_tensor(arg))
        self.last_specs, self.last_args = specs, args
        return tuple((s.shape, s.dtype) for s in specs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            # Called from another converted function being compiled, or from an export: its
            # converted code joins the caller's graph (no torch.compile inside torch.compile).
            return self._target()(*args, **kwargs)
        key = self._record_specs(args)
        compiled = self._compile()
        compiles, breaks = self._stats["compiles"], _graph_break_count()
        refused = (f"torch.compile(fullgraph=True) cannot capture '{self.__qualname__}' as one graph (the "
                   "converted function runs eagerly)")
        with dy2static_errors(refused, cls=GraphBreakError, explain=lambda: self._explain(args, kwargs)):
            # A tensor array's length (TensorArray.stack) is read with .item() inside the graph.
            with torch._dynamo.config.patch(capture_scalar_outputs=True):
                out = compiled(*args, **kwargs)
        self._stats["calls"] += 1
        self._stats["graph_breaks"] += _graph_break_count() - breaks
        if self._stats["compiles"] == compiles:
            self._stats["cache_hits"] += 1
        self._specs_seen.add(key)
        return out

    def _explain(self, args: tuple, kwargs: dict) -> Exception | None:
        """What to raise when the compiled call failed, unless torch.compile's refusal is the story.

        If the original Python function fails on these inputs too, the error is the user's own:
        it is raised as itself. If the converted function fails eagerly, conversion failed: a
        :class:`Dy2StaticError` naming the user's line. None when both run, so that
        ``torch.compile`` could not capture a function that works (a :class:`GraphBreakError`).
        """
        try:
            with original_forwards():
                self.dygraph_function(*args, **kwargs)
        except Exception as user_error:  # noqa: BLE001 - the user's own error, reported as it is
            return user_error
        try:
            self.eager(*args, **kwargs)
        except Exception as eager_error:  # noqa: BLE001 - reported as a Dy2StaticError
            return to_dy2static(eager_error, f"'{self.__qualname__}' could not be converted")
        return None

    def __repr__(self) -> str:
        return f"<StaticFunction {self.__qualname__} {self.stats()}>"

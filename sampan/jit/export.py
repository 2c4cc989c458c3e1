"""``jit.save`` / ``jit.load``: a converted function as ``.pt2`` + ``.onnx`` + ``.json``.

``save`` exports the *converted* function, so tensor control flow is in the files as
``cond`` / ``while_loop`` (``If`` / ``Loop`` nodes in ONNX). Layers the function reaches through
its globals or closure become sub-layers of the exported module, so their weights are the
program's parameters. ``load`` runs the ``.pt2`` (or the ``.onnx`` through onnxruntime) without
the original Python source.
"""

from __future__ import annotations

import inspect
import json
import os
import types
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sampan.jit.diagnose import dy2static_errors
from sampan.jit.errors import Dy2StaticError, ExportError
from sampan.jit.probe import remove_probe_nodes
from sampan.jit.static_function import StaticFunction
from sampan.jit.torch_fixes import onnx_subgraph_opsets
from sampan.static import InputSpec
from sampan.utils.atomic import atomic_write


class _ExportModule(nn.Module):
    """The converted function as a module: tensor inputs in, fixed Python arguments baked in."""

    def __init__(self, static: StaticFunction, layout: list[Any], layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)  # registers the weights the function uses
        self._static = static
        self._layout = layout  # per positional argument: None (a tensor input) or the fixed value

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        args = [next(it) if fixed is _TENSOR else fixed for fixed in self._layout]
        return self._static.eager(*args)


_TENSOR = object()


def _static_function(target: Any) -> StaticFunction:
    if isinstance(target, StaticFunction):
        return target
    if isinstance(target, nn.Module):
        forward = target.forward
        if isinstance(forward, StaticFunction):
            return forward
        return StaticFunction(type(target).forward, instance=target)
    if callable(target):
        return StaticFunction(target)
    raise TypeError(f"jit.save takes a to_static function or a Layer, got {type(target).__name__}")


def _referenced_layers(static: StaticFunction) -> list[nn.Module]:
    if isinstance(static._instance, nn.Module):
        return [static._instance]
    fn = static._function
    names = set(fn.__code__.co_names)
    found = [fn.__globals__[n] for n in sorted(names) if isinstance(fn.__globals__.get(n), nn.Module)]
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if isinstance(value, nn.Module):
            found.append(value)
    unique: dict[int, nn.Module] = {id(m): m for m in found}
    return list(unique.values())


def _param_names(static: StaticFunction) -> list[str]:
    params = list(inspect.signature(static._function).parameters)
    return params[1:] if static._instance is not None else params


def _inputs(static: StaticFunction, input_spec: Sequence[InputSpec] | None,
            examples: Sequence[torch.Tensor] | None = None):
    """(layout, example tensors, specs) for the export."""
    names = _param_names(static)
    if input_spec is None and static.input_spec is None and static.last_args is None:
        raise ValueError(f"jit.save needs the input shapes of '{static.__qualname__}': call the function once "
                         "with example inputs, or pass input_spec=[InputSpec(shape, dtype), ...]")
    if input_spec is None and static.last_args is not None:
        layout = [_TENSOR if isinstance(a, torch.Tensor) else a for a in static.last_args]
        examples = [a.detach() for a in static.last_args if isinstance(a, torch.Tensor)]
        specs = list(static.last_specs or [])
    else:
        specs = list(input_spec if input_spec is not None else static.input_spec)
        layout = [_TENSOR] * len(specs)
        last = [a for a in static.last_args or () if isinstance(a, torch.Tensor)]
        if examples is not None:
            bad = [s.name or f"input {i}" for i, (s, t) in enumerate(zip(specs, examples, strict=False))
                   if not s.matches(t)]
            if len(examples) != len(specs) or bad:
                raise ValueError(f"jit.save: the examples must fit input_spec one for one (got {len(examples)} for "
                                 f"{len(specs)} specs; not fitting: {bad})")
            examples = [t.detach() for t in examples]
        else:
            fits = len(last) == len(specs) and all(s.matches(t) for s, t in zip(specs, last, strict=True))
            examples = [t.detach() for t in last] if fits else [s.example(dynamic_size=3) for s in specs]
    tensor_names = [n for n, fixed in zip(names, layout, strict=False) if fixed is _TENSOR]
    specs = [InputSpec(s.shape, s.dtype, s.name or (tensor_names[i] if i < len(tensor_names) else f"input_{i}"))
             for i, s in enumerate(specs)]
    return layout, examples, specs


def _dynamic_shapes(specs: list[InputSpec]) -> tuple | None:
    """torch.export's ``dynamic_shapes`` for the specs' ``None`` dimensions.

    Each is ``Dim.DYNAMIC``, not a named ``Dim`` of its own: real models relate their inputs'
    sizes (``input_ids`` and ``attention_mask`` share batch and sequence; a position table caps
    the sequence at 512), which independent named Dims cannot express (torch.export raises
    "Constraints violated ... must always be equal"). ``Dim.DYNAMIC`` lets torch.export infer
    those equalities and bounds, and still fails if a ``None`` dimension gets specialised to
    one size. (``sampan.inference`` records the inferred relations in ``inference.json``.)
    """
    if not any(s.dynamic_dims for s in specs):
        return None
    # One entry for _ExportModule.forward's single parameter (*tensors), holding one per tensor.
    return (tuple({d: torch.export.Dim.DYNAMIC for d in s.dynamic_dims} or None for s in specs),)


def _tensor_json(name: str, t: Any) -> dict:
    shape = [int(d) if isinstance(d, int) else None for d in t.shape]
    return {"name": name, "shape": shape, "dtype": str(t.dtype).removeprefix("torch.")}


def save(function_or_layer: Callable | nn.Module, path: str | os.PathLike[str],
         input_spec: Sequence[InputSpec] | None = None, onnx: bool = True,
         examples: Sequence[torch.Tensor] | None = None) -> dict[str, Path]:
    """Export to ``path.pt2`` (torch.export), ``path.onnx`` (dynamo ONNX exporter) and ``path.json``.

    ``onnx=False`` skips the ONNX file (the slower half of an export). ``examples`` (one tensor per
    ``input_spec`` entry) are what the function is traced on, for inputs whose sizes are related in
    ways zero tensors of one size cannot show (a decode step's mask one longer than its cache);
    by default they are made from the specs, every dynamic dimension 3.

    Input shapes come from ``input_spec``, else from the specs given to ``to_static`` or the last
    call (non-tensor arguments of that call are fixed into the export). ``None`` dimensions are
    dynamic in both files. Returns the written paths. If ``torch.export`` fails, an
    :class:`ExportError` (a ``Dy2StaticError``) names the user's line. If only the ONNX exporter
    fails, the ``.pt2`` and ``.json`` are still written, with the reason under ``onnx_error`` in
    the ``.json``, and a warning is given.
    """
    from sampan._version import __version__

    static = _static_function(function_or_layer)
    layout, examples, specs = _inputs(static, input_spec, examples)
    module = _ExportModule(static, layout, _referenced_layers(static))
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    dynamic = _dynamic_shapes(specs)
    code = static._function.__code__
    where = f"{code.co_filename}:{code.co_firstlineno}"  # when no frame of the user's names a line
    with dy2static_errors(f"jit.save: torch.export cannot export '{static.__qualname__}'", where, ExportError):
        program = torch.export.export(module, tuple(examples), dynamic_shapes=dynamic, strict=False)
    remove_probe_nodes(program.graph_module)  # what probes of branches and loop bodies recorded
    files = {"pt2": base.with_name(base.name + ".pt2"), "onnx": base.with_name(base.name + ".onnx"),
             "json": base.with_name(base.name + ".json")}
    torch.export.save(program, files["pt2"])
    input_names = [s.name for s in specs]
    outputs = [n.meta["val"] for n in program.graph.output_node().args[0]]
    output_names = [f"output_{i}" for i in range(len(outputs))]
    onnx_error = None
    try:
        if onnx:
            with dy2static_errors(f"jit.save: the ONNX exporter cannot export '{static.__qualname__}'", where):
                with onnx_subgraph_opsets():
                    onnx_program = torch.onnx.export(program, tuple(examples), input_names=input_names,
                                                     output_names=output_names, dynamo=True, verbose=False)
                onnx_program.save(str(files["onnx"]))
        else:
            files.pop("onnx").unlink(missing_ok=True)  # no stale file from an earlier save
    except Dy2StaticError as e:  # the .pt2 is still written; the .json records why
        # The .pt2 is the program; ONNX is a second format some ops lack (the exporter names the
        # op). The reason goes into the .json and a warning, in sampan's words first.
        onnx_error = str(e)
        warnings.warn(f"jit.save wrote {files['pt2'].name} but no ONNX file: {onnx_error}", stacklevel=2)
        files.pop("onnx").unlink(missing_ok=True)
    meta = {
        "format": "sampan.jit/1",
        "function": static.__qualname__,
        "inputs": [s.to_json() for s in specs],
        "outputs": [_tensor_json(n, v) for n, v in zip(output_names, outputs, strict=True)],
        "sampan_version": __version__,
        "torch_version": torch.__version__,
        "files": {k: v.name for k, v in files.items()},
        "onnx_error": onnx_error,
    }
    atomic_write(files["json"], json.dumps(meta, indent=2) + "\n")
    return files


class LoadedFunction:
    """A saved function, run by the ``.pt2`` program or by onnxruntime on the ``.onnx`` file.

    Attributes:
        meta: the ``.json`` description (input and output names, shapes, dtypes, versions).
    """

    def __init__(self, path: str | os.PathLike[str], backend: str = "pt2", num_threads: int | None = None):
        base = Path(path)
        json_path = base.with_name(base.name + ".json")
        if not json_path.exists():
            raise FileNotFoundError(f"{json_path} not found: jit.load takes the path given to jit.save "
                                    "(without the .pt2 / .onnx / .json suffix)")
        self.meta = json.loads(json_path.read_text())
        self.backend = backend
        if backend == "pt2":
            self._run = torch.export.load(base.with_name(base.name + ".pt2")).module()
        elif backend == "onnxruntime":
            import onnxruntime

            options = onnxruntime.SessionOptions()
            if num_threads is not None:
                options.intra_op_num_threads = options.inter_op_num_threads = num_threads
            session = onnxruntime.InferenceSession(str(base.with_name(base.name + ".onnx")), options,
                                                   providers=["CPUExecutionProvider"])
            self._run = types.MethodType(_run_onnx, session)
        else:
            raise ValueError(f"backend must be 'pt2' or 'onnxruntime', got {backend!r}")

    def __call__(self, *args: torch.Tensor) -> Any:
        expected = self.meta["inputs"]
        if len(args) != len(expected):
            names = [i["name"] for i in expected]
            raise TypeError(f"this saved function takes {len(expected)} tensor inputs {names}, got {len(args)}")
        return self._run(*args)


def _run_onnx(session: Any, *args: torch.Tensor) -> Any:
    feeds = {i.name: a.detach().cpu().numpy() for i, a in zip(session.get_inputs(), args, strict=True)}
    outs = [torch.from_numpy(o) for o in session.run(None, feeds)]
    return outs[0] if len(outs) == 1 else tuple(outs)


def load(path: str | os.PathLike[str], backend: str = "pt2", num_threads: int | None = None) -> LoadedFunction:
    """Load what :func:`save` wrote at ``path``; ``backend`` is "pt2" (torch) or "onnxruntime".

    ``num_threads`` sets onnxruntime's thread pools (default: one thread per core); the ``.pt2``
    runs on torch's threads (``torch.set_num_threads``).
    """
    return LoadedFunction(path, backend, num_threads)

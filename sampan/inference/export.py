"""Writing inference directories: ``export_model`` (any function or Layer) and ``export_pretrained``.

An inference directory is what ``sampan.jit.save(fn, DIR / "inference", input_spec=...)`` writes
(``inference.pt2``, ``inference.onnx``, ``inference.json``). These helpers write it atomically
(a temporary sibling directory renamed into place) and add to ``inference.json``, per dynamic
input dimension, which dimensions must be equal and their largest size, so the Predictor can name
a bad input instead of failing inside ONNX Runtime.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sampan.inference.config import MODEL_PREFIX
from sampan.static import InputSpec
from sampan.utils.atomic import atomic_dir


def _describe_dims(directory: Path, meta: dict[str, Any]) -> None:
    """Add ``dims`` to each input of ``meta``: per dynamic dimension a symbol shared by every
    dimension that must be equal (named after its first occurrence) and the largest size, read
    from the exported program's range constraints."""
    program = torch.export.load(directory / f"{MODEL_PREFIX}.pt2")
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    names: dict[str, str] = {}
    for entry, node_name in zip(meta["inputs"], program.graph_signature.user_inputs, strict=True):
        dims: list[dict[str, Any] | None] = []
        for axis, size in enumerate(placeholders[node_name].meta["val"].shape):
            if isinstance(size, int):
                entry["shape"][axis] = size  # torch.export fixed it; say so
                dims.append(None)
                continue
            expr = size.node.expr
            names.setdefault(str(expr), f"{entry['name']}.shape[{axis}]")
            bound = program.range_constraints.get(expr)
            upper = bound.upper if bound is not None else None
            dims.append({"symbol": names[str(expr)],
                         # int_oo (no bound) is not a sympy Integer
                         "max": int(upper) if getattr(upper, "is_Integer", False) else None})
        entry["dims"] = dims


def _rename_outputs(directory: Path, meta: dict[str, Any], output_names: Sequence[str]) -> None:
    """Give the outputs ``output_names`` in ``meta`` and in the ``.onnx`` (``jit.save`` calls them
    ``output_i``); an ``Identity`` per output renames it without touching the graph inside."""
    if len(output_names) != len(meta["outputs"]):
        raise ValueError(f"output_names has {len(output_names)} names but the model gives "
                         f"{len(meta['outputs'])} outputs")
    mapping = {e["name"]: new for e, new in zip(meta["outputs"], output_names, strict=True)}
    for entry in meta["outputs"]:
        entry["name"] = mapping[entry["name"]]
    onnx_path = directory / f"{MODEL_PREFIX}.onnx"
    if not onnx_path.is_file():
        return
    import onnx

    model = onnx.load(str(onnx_path))
    for output in model.graph.output:
        if output.name in mapping and mapping[output.name] != output.name:
            model.graph.node.append(onnx.helper.make_node("Identity", [output.name], [mapping[output.name]],
                                                          name=f"rename_{mapping[output.name]}"))
            output.name = mapping[output.name]
    onnx.save(model, str(onnx_path))


def _check_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory; choose another output path")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists: pass overwrite=True (`sampan export --overwrite`) "
                              "to replace it, or choose another directory")


def export_model(fn_or_layer: Callable | nn.Module, out_dir: str | os.PathLike[str], input_spec: Sequence[InputSpec],
                 *, overwrite: bool = False, output_names: Sequence[str] | None = None,
                 extra_files: Sequence[str | os.PathLike[str]] = (),
                 verify: Callable[[Path], None] | None = None,
                 examples: Sequence[torch.Tensor] | None = None) -> Path:
    """Write an inference directory for ``fn_or_layer`` at ``out_dir`` through ``sampan.jit.save``.

    ``input_spec`` gives each tensor input's shape (None = dynamic), dtype and name. Dynamic
    dimensions may be tied (equal sizes) and bounded; torch.export works that out and it is
    recorded in ``inference.json``. ``output_names`` renames the outputs (default ``output_i``);
    ``extra_files`` are copied in beside the model (tokenizer.json, task.json, ...); ``verify``
    is called on the finished temporary directory and may raise to abandon the export.
    ``examples`` (one tensor per spec) are traced instead of tensors made from the specs
    (``sampan.jit.save``), for inputs whose sizes are related.

    Atomic: everything is written into a temporary sibling directory that replaces ``out_dir`` by
    a rename only when complete, so a failure leaves nothing behind (and an existing ``out_dir``
    untouched). An existing ``out_dir`` is an error unless ``overwrite=True``.
    """
    from sampan.jit import save

    out = Path(out_dir)
    _check_target(out, overwrite)
    extras = [Path(p) for p in extra_files]
    for path in extras:
        if not path.is_file():
            raise FileNotFoundError(f"extra file {path} not found")
    with atomic_dir(out) as tmp:  # overwrite swaps the old directory out only once the new one is whole
        save(fn_or_layer, tmp / MODEL_PREFIX, input_spec=input_spec, examples=examples)
        json_path = tmp / f"{MODEL_PREFIX}.json"
        meta = json.loads(json_path.read_text(encoding="utf-8"))
        _describe_dims(tmp, meta)
        if output_names is not None:
            _rename_outputs(tmp, meta, output_names)
        json_path.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        for path in extras:
            shutil.copyfile(path, tmp / path.name)
        if verify is not None:
            verify(tmp)
    return out

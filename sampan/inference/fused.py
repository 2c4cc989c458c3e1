"""The exported graph with onnxscript's ONNX Runtime fusions, made once and cached beside it.

ONNX Runtime's own graph optimizer does not recognise the dynamo exporter's graphs (it fuses no
attention or layer norm in them), so a transformer runs as dozens of small kernels: attention as
MatMul / Softmax with the IsNaN / Where guards of the SDPA decomposition. onnxscript's rewriter
(``optimize_for_ort``) knows that exporter's patterns and turns them into ORT's contrib kernels
(``Attention``, ``SkipLayerNormalization``, ``BiasGelu``). The result runs only on ONNX Runtime,
which is why the ``.onnx`` an export writes stays standard and the fused graph is a derived file
(``inference.ort.onnx``, see ``sampan.inference.derived``). Rewriting takes about 0.9 s for
ernie-tiny (half of it importing onnxscript); a cached file loads with no onnxscript import at all.

One of those fusions is undone on purpose. ONNX Runtime's CPU ``SkipLayerNormalization`` kernel
(1.32) is about 3x slower than the ``Add`` + ``LayerNormalization`` it replaces: 2.57 ms against
0.83 ms on a 32 x 128 x 256 tensor, 2 threads. So every such node is split back into its adds and a
standard ``LayerNormalization`` (:func:`split_skip_layer_norms`), and the backend turns ORT's own
``SkipLayerNormFusion`` off so that ORT does not fuse them again. On the shipped sentiment model
that takes a 32 x 128 batch from 142 to 123 ms, 1.15x (both figures from ``benchmarks/predictor.py``).

The fused file carries, in its ONNX metadata, how many of each fusion applied and one stamp of
what made it (:func:`made_by`: the onnxscript version and :data:`RECIPE`, what sampan does on
top); a file with another stamp is remade.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sampan.inference.derived import derived_path

FUSED_SUFFIX = ".ort.onnx"
FUSIONS_KEY = "sampan.ort_fusions"
MADE_BY_KEY = "sampan.fused_by"
RECIPE = "2: skip-layer-norms split"  # change it whenever the rewrite below changes: cached files are remade
# ORT's own graph optimizers that would undo split_skip_layer_norms; the backend disables them.
ORT_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def onnxscript_version() -> str:
    return importlib.metadata.version("onnxscript")  # without importing it (0.5 s)


def made_by() -> str:
    """The stamp a fused file must carry to be current: a new onnxscript or a new sampan recipe
    can each change the rewrite, so either one invalidates the cached file."""
    return f"onnxscript {onnxscript_version()}; recipe {RECIPE}"


def split_skip_layer_norms(model: Any) -> int:
    """Replace each ``com.microsoft`` ``SkipLayerNormalization`` in the ``onnx_ir`` model by
    ``Add(input, skip) [+ bias]`` and a standard ``LayerNormalization``, in place; return how many.

    Why: that contrib kernel is several times slower on CPU than the two ops it fuses (module
    docstring). Its residual-sum output (3) becomes the sum; a node whose mean or inverse-std
    outputs are read is left as it is.
    """
    import onnx_ir

    split = 0
    for node in list(model.graph):
        if node.op_type != "SkipLayerNormalization" or node.domain != "com.microsoft":
            continue
        outputs = list(node.outputs) + [None] * (4 - len(node.outputs))
        if any(o is not None and (o.uses() or o.is_graph_output()) for o in outputs[1:3]):
            continue
        x, skip, gamma, beta, bias = (list(node.inputs) + [None] * 5)[:5]
        added = [onnx_ir.node("Add", [x, skip])]
        if bias is not None:
            added.append(onnx_ir.node("Add", [added[-1].outputs[0], bias]))
        epsilon = node.attributes["epsilon"].value if "epsilon" in node.attributes else 1e-12
        norm = onnx_ir.node("LayerNormalization", [added[-1].outputs[0], gamma, beta],
                            attributes={"axis": -1, "epsilon": epsilon})
        model.graph.insert_after(node, [*added, norm])
        for old, new in ((outputs[0], norm.outputs[0]), (outputs[3], added[-1].outputs[0])):
            if old is None:
                continue
            new.shape, new.type = old.shape, old.type
            was_output, name = old.is_graph_output(), old.name
            onnx_ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
            if was_output:  # a graph output keeps its name: callers feed and read by name
                old.name, new.name = None, name
        model.graph.remove(node, safe=True)
        split += 1
    return split


def fused_for_ort(path: Path) -> tuple[bytes, dict[str, int]]:
    """The graph at ``path`` rewritten by onnxscript's ONNX Runtime fusions, minus the
    skip-layer-norm one (module docstring), serialized with its metadata (fusion counts and
    :func:`made_by`), and how many of each fusion it holds."""
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = onnx_ir.load(str(path))
    model, stats = optimize_for_ort(model)
    stats = dict(stats)
    stats["skip_layer_normalization"] = stats.get("skip_layer_normalization", 0) - split_skip_layer_norms(model)
    fusions = {k: int(v) for k, v in stats.items() if v}
    model.metadata_props[FUSIONS_KEY] = json.dumps(fusions, sort_keys=True)
    model.metadata_props[MADE_BY_KEY] = made_by()
    return onnx_ir.to_proto(model).SerializeToString(), fusions


def _write_fused(source: Path, target: Path) -> None:
    data, _ = fused_for_ort(source)
    target.write_bytes(data)


def fused_session(source: Path, open_session: Callable[[Path], Any]) -> tuple[Any, dict[str, int]]:
    """``open_session`` on the fused version of ``source`` and the fusion counts recorded in it.

    The fused file is ``inference.ort.onnx`` beside ``source`` (or in ``$SAMPAN_HOME/cache/ort``
    when its directory is read-only), made when missing or older than the source. Its stamp
    (:func:`made_by`) is read from the session's metadata, so a current file costs no extra read;
    a file with another stamp is made again once.
    """
    for remake in (False, True):
        fused = derived_path(source, FUSED_SUFFIX, "ort", _write_fused, remake=remake)
        session = open_session(fused)
        metadata = session.get_modelmeta().custom_metadata_map
        stamp = metadata.get(MADE_BY_KEY)
        if stamp == made_by():
            fusions = json.loads(metadata.get(FUSIONS_KEY, "{}"))
            return session, {k: int(v) for k, v in fusions.items()}
    raise RuntimeError(f"{fused} is stamped {stamp!r}, not {made_by()!r}, even when remade")

"""The exported graph with onnxscript's ONNX Runtime fusions, made once and cached beside it.

ONNX Runtime's own graph optimizer does not recognise the dynamo exporter's graphs (it fuses no
attention or layer norm in them), so a transformer runs as dozens of small kernels: attention as
MatMul / Softmax with the IsNaN / Where guards of the SDPA decomposition. onnxscript's rewriter
(``optimize_for_ort``) knows that exporter's patterns and turns them into ORT's contrib kernels
(``Attention``, ``SkipLayerNormalization``, ``BiasGelu``). The result runs only on ONNX Runtime,
which is why the ``.onnx`` an export writes stays standard and the fused graph is a derived file
(``inference.ort.onnx``, see ``sampan.inference.derived``). Rewriting takes about 0.9 s for
ernie-tiny (half of it importing onnxscript); a cached file loads with no onnxscript import at all.

The fused file carries, in its ONNX metadata, how many of each fusion applied and the onnxscript
version that made it; a file from another onnxscript version is remade.
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
VERSION_KEY = "sampan.onnxscript_version"


def onnxscript_version() -> str:
    return importlib.metadata.version("onnxscript")  # without importing it (0.5 s)


def fused_for_ort(path: Path) -> tuple[bytes, dict[str, int]]:
    """The graph at ``path`` rewritten by onnxscript's ONNX Runtime fusions, serialized (with the
    fusion counts and the onnxscript version in its metadata), and how many of each fusion applied."""
    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model = onnx_ir.load(str(path))
    model, stats = optimize_for_ort(model)
    fusions = {k: int(v) for k, v in stats.items() if v}
    model.metadata_props[FUSIONS_KEY] = json.dumps(fusions, sort_keys=True)
    model.metadata_props[VERSION_KEY] = onnxscript_version()
    return onnx_ir.to_proto(model).SerializeToString(), fusions


def _write_fused(source: Path, target: Path) -> None:
    data, _ = fused_for_ort(source)
    target.write_bytes(data)


def fused_session(source: Path, open_session: Callable[[Path], Any]) -> tuple[Any, dict[str, int]]:
    """``open_session`` on the fused version of ``source`` and the fusion counts recorded in it.

    The fused file is ``inference.ort.onnx`` beside ``source`` (or in ``$SAMPAN_HOME/cache/ort``
    when its directory is read-only), made when missing or older than the source. Its onnxscript
    version is read from the session's metadata, so a current file costs no extra read; a file from
    another version is made again once.
    """
    for remake in (False, True):
        fused = derived_path(source, FUSED_SUFFIX, "ort", _write_fused, remake=remake)
        session = open_session(fused)
        metadata = session.get_modelmeta().custom_metadata_map
        version = metadata.get(VERSION_KEY)
        if version == onnxscript_version():
            fusions = json.loads(metadata.get(FUSIONS_KEY, "{}"))
            return session, {k: int(v) for k, v in fusions.items()}
    raise RuntimeError(f"{fused} records onnxscript {version}, not {onnxscript_version()}, even when remade")

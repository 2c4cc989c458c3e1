"""int8 weights for small devices: ONNX Runtime dynamic quantization of ``inference.onnx``.

Dynamic quantization stores weights as int8 and quantizes activations on the fly per call, so it
needs no calibration data. Measured on the dynamo-exported sampan models (docs/inference.md):

- ``quant_pre_process`` is not used: its symbolic shape inference fails on these graphs
  (``TypeError: object of type 'NoneType' has no len()``), and with it skipped the output was
  larger and no more accurate than quantizing the exported file directly.
- ``Gather`` (the embedding tables) is quantized besides ``MatMul`` / ``Gemm``: the embeddings are
  most of a small model's bytes (ernie-tiny 2 layers: 29.0 MB -> 24.1 MB with MatMul/Gemm only,
  7.5 MB with Gather too), at a small extra error.
- Per-channel weight scales were no more accurate here, so per-tensor (the default) is used.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from sampan.inference.derived import derived_path

INT8_OP_TYPES = ("MatMul", "Gemm", "Gather")
INT8_SUFFIX = ".int8.onnx"


def _quantize(source: Path, target: Path) -> None:
    """Quantize ``source`` to ``target`` (inside ``derived``'s private working directory).

    ``quantize_dynamic`` writes a ``<name>-inferred.onnx`` beside its input while it runs, so it is
    given a link to ``source`` inside that directory: nothing is written next to ``source`` (which
    may be read-only).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # quantize_dynamic logs "Please consider to run pre-processing" on the root logger; pre-processing
    # was measured and is deliberately skipped (module docstring), so that advice is noise here.
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        link = target.parent / "model.onnx"
        try:
            link.symlink_to(source.resolve())
        except OSError:  # no symlinks on this filesystem
            shutil.copyfile(source, link)
        quantize_dynamic(str(link), str(target), weight_type=QuantType.QInt8,
                         op_types_to_quantize=list(INT8_OP_TYPES))
    finally:
        root.setLevel(level)


def int8_model_path(onnx_path: str | os.PathLike[str]) -> Path:
    """The int8 version of ``onnx_path``, made on first use and reused afterwards.

    It is written beside the source as ``inference.int8.onnx``; when that directory is read-only
    (a model shipped inside the installed package) it goes to
    ``$SAMPAN_HOME/cache/int8/<sha256 of the fp32 file>.onnx`` instead, so an updated model never
    reuses a stale quantization. A beside-file older than its source is remade.
    """
    return derived_path(Path(onnx_path), INT8_SUFFIX, "int8", _quantize)

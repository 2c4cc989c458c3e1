"""int8 weights for small devices: ONNX Runtime dynamic quantization of ``inference.onnx``.

Dynamic quantization stores weights as int8 and quantizes activations on the fly per call, so it
needs no calibration data. Measured on the dynamo-exported sampan models (docs/inference.md):

- ``quant_pre_process`` is not used: its symbolic shape inference fails on these graphs
  (``TypeError: object of type 'NoneType' has no len()``), and with it skipped the output was
  larger and no more accurate than quantizing the exported file directly.
- ``Gather`` (the embedding tables) is quantized besides ``MatMul`` / ``Gemm``: the embeddings are
  most of a small model's bytes (ernie-tiny 2 layers: 29.0 MB -> 24.1 MB with MatMul/Gemm only,
  7.5 MB with Gather too), at a small extra error.
- Weights are unsigned 8-bit with per-channel scales (see ``_quantize``): signed int8 weights
  saturate ORT's matmul on CPUs without VNNI. Per-channel scales were no more accurate than
  per-tensor with signed weights on an AVX512 machine; with unsigned ones they keep the GPT
  test's argmax agreement at >= 90% where per-tensor gives 89%.
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
        # Unsigned 8-bit weights, one scale per output channel. With signed weights ORT runs a
        # u8 x s8 matmul that on x86 CPUs without VNNI (AVX2, plain AVX512) sums pairs of products
        # in 16 bits and saturates: on this AMD EPYC (AVX2 only) a feature model's logits came out
        # 30% off. The file must run on whatever CPU loads it; u8 x u8 has no such path, and
        # per-channel scales win back the precision 7-bit reduce_range would have cost.
        quantize_dynamic(str(link), str(target), weight_type=QuantType.QUInt8, per_channel=True,
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

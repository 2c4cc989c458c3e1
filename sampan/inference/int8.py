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

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

INT8_OP_TYPES = ("MatMul", "Gemm", "Gather")
INT8_SUFFIX = ".int8.onnx"


def sampan_home() -> Path:
    """``$SAMPAN_HOME``, default ``~/.sampan``: models and caches that live outside the package."""
    return Path(os.environ.get("SAMPAN_HOME") or "~/.sampan").expanduser()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _quantize_into(source: Path, target: Path) -> None:
    """Quantize ``source`` to ``target`` atomically, working in a private temporary directory.

    ``quantize_dynamic`` writes a ``<name>-inferred.onnx`` beside its input while it runs, so it is
    given a link to ``source`` inside that directory: nothing is written next to ``source`` (which
    may be read-only) and two processes quantizing at once do not collide.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    # quantize_dynamic logs "Please consider to run pre-processing" on the root logger; pre-processing
    # was measured and is deliberately skipped (module docstring), so that advice is noise here.
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        link = work / "model.onnx"
        try:
            link.symlink_to(source.resolve())
        except OSError:  # no symlinks on this filesystem
            shutil.copyfile(source, link)
        quantize_dynamic(str(link), str(work / "int8.onnx"), weight_type=QuantType.QInt8,
                         op_types_to_quantize=list(INT8_OP_TYPES))
        os.replace(work / "int8.onnx", target)
    finally:
        root.setLevel(level)
        shutil.rmtree(work, ignore_errors=True)


def _writable(directory: Path) -> bool:
    if not os.access(directory, os.W_OK):
        return False
    try:  # os.access says yes on some read-only mounts; a real probe settles it
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError:
        return False
    return True


def int8_model_path(onnx_path: str | os.PathLike[str]) -> Path:
    """The int8 version of ``onnx_path``, made on first use and reused afterwards.

    It is written beside the source as ``inference.int8.onnx``; when that directory is read-only
    (a model shipped inside the installed package) it goes to
    ``$SAMPAN_HOME/cache/int8/<sha256 of the fp32 file>.onnx`` instead, so an updated model never
    reuses a stale quantization. A beside-file older than its source is remade.
    """
    source = Path(onnx_path)
    beside = source.with_name(source.name.removesuffix(".onnx") + INT8_SUFFIX)
    if beside.is_file() and beside.stat().st_mtime >= source.stat().st_mtime:
        return beside
    if _writable(source.parent):
        _quantize_into(source, beside)
        return beside
    cached = sampan_home() / "cache" / "int8" / f"{_sha256(source)}.onnx"
    if not cached.is_file():
        _quantize_into(source, cached)
    return cached

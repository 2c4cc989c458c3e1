"""``Config``: which exported model to run, on which backend and device, at which precision."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from sampan.inference.device import cuda_index, is_gpu
from sampan.utils.device import check_device_spec

# The file stem `sampan.jit.save` is given inside an inference directory.
MODEL_PREFIX = "inference"
BACKENDS = ("onnxruntime", "torch")
PRECISIONS = ("fp32", "int8")
_EXPORT_HINT = "export it with sampan.inference.export_pretrained(...) or `sampan export`"


@dataclasses.dataclass
class Config:
    """Settings of one :class:`~sampan.inference.Predictor` (Paddle's ``paddle.inference.Config``).

    Fields:
        model_dir: an inference directory: ``inference.json`` plus ``inference.onnx`` and/or
            ``inference.pt2`` as written by ``sampan.jit.save(fn, DIR / "inference", ...)``
            (``export_model`` / ``export_pretrained`` / ``sampan export`` write one). Other files
            there (tokenizer.json, task.json, config.json) are ignored.
        backend: "onnxruntime" (default: ONNX Runtime with all graph optimizations) or
            "torch" (the ``.pt2`` program, loaded by ``torch.export.load``).
        num_threads: ONNX Runtime intra-op threads (None: one per core). The torch backend uses
            torch's own pool (``torch.set_num_threads``), which is process-wide, so it is not set here.
        precision: "fp32", or "int8": weights dynamically quantized to int8 by ONNX Runtime
            (onnxruntime backend only), made once into ``inference.int8.onnx`` and reused.
        fuse: onnxruntime backend: rewrite the graph with onnxscript's ONNX Runtime fusions
            (``Attention``, ``BiasGelu``; its ``SkipLayerNormalization`` split back, being slower
            on CPU: ``sampan.inference.fused``), made once into
            ``inference.ort.onnx`` and reused; ``inference.onnx`` is not changed. False runs the
            graph exactly as exported.
        device: where the predictor runs: "cpu" (default), "cuda" / "cuda:N" (Paddle's "gpu" /
            "gpu:N" too), or "auto" (the GPU when the backend can use one, else the CPU). The
            torch backend runs the ``.pt2`` on the GPU torch sees; ONNX Runtime needs the
            ``onnxruntime-gpu`` wheel (``sampan.inference.device``). Only the spelling is checked
            here, on any machine; ``create_predictor`` checks the hardware. Paddle's
            ``enable_use_gpu`` / ``disable_gpu`` set it.
    """

    model_dir: str | os.PathLike[str]
    backend: str = "onnxruntime"
    num_threads: int | None = None
    precision: str = "fp32"
    fuse: bool = True
    device: str = "cpu"

    def __post_init__(self) -> None:
        self.model_dir = Path(self.model_dir)
        self.validate()

    # --- paths ---------------------------------------------------------------------------------
    @property
    def json_path(self) -> Path:
        return Path(self.model_dir) / f"{MODEL_PREFIX}.json"

    @property
    def onnx_path(self) -> Path:
        return Path(self.model_dir) / f"{MODEL_PREFIX}.onnx"

    @property
    def pt2_path(self) -> Path:
        return Path(self.model_dir) / f"{MODEL_PREFIX}.pt2"

    def meta(self) -> dict[str, Any]:
        """The directory's ``inference.json`` (input / output names, shapes, dtypes)."""
        return json.loads(self.json_path.read_text(encoding="utf-8"))

    # --- validation ----------------------------------------------------------------------------
    def validate(self) -> None:
        """Check every field and the directory; raise ``ValueError`` / ``FileNotFoundError`` naming the fix."""
        # The fields first: a misspelt backend is reported as such, whatever the directory holds.
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        self.device = check_device_spec(self.device)  # a DeviceError (ValueError) names the spellings
        if not isinstance(self.fuse, bool):
            raise ValueError(f"fuse must be True or False, got {self.fuse!r}")
        if self.precision == "int8" and self.backend != "onnxruntime":
            raise ValueError("precision='int8' runs on ONNX Runtime's integer kernels: use backend='onnxruntime'")
        if self.num_threads is not None and (isinstance(self.num_threads, bool) or not isinstance(self.num_threads, int)
                                             or self.num_threads < 1):
            raise ValueError(f"num_threads must be a positive int or None (one per core), got {self.num_threads!r}")
        directory = Path(self.model_dir)
        if not directory.is_dir():
            what = "is a file, not a directory" if directory.exists() else "does not exist"
            raise FileNotFoundError(f"inference model directory {directory} {what}: {_EXPORT_HINT}")
        if not self.json_path.is_file():
            raise FileNotFoundError(f"no {self.json_path.name} in {directory}: it is not an inference directory; "
                                    f"{_EXPORT_HINT}")
        if self.backend == "onnxruntime" and not self.onnx_path.is_file():
            reason = self.meta().get("onnx_error")
            why = f" (the ONNX export failed: {reason})" if reason else ""
            other = " or use backend='torch' (the .pt2 is there)" if self.pt2_path.is_file() else ""
            raise FileNotFoundError(f"no {self.onnx_path.name} in {directory}{why}: {_EXPORT_HINT}{other}")
        if self.backend == "torch" and not self.pt2_path.is_file():
            raise FileNotFoundError(f"no {self.pt2_path.name} in {directory}: {_EXPORT_HINT}")

    # --- Paddle-compatible setters (thin: each sets a field and re-validates) -----------------
    def enable_int8(self) -> None:
        """Run int8 weights (ONNX Runtime dynamic quantization); ``precision="int8"``."""
        self._set(precision="int8")

    def set_cpu_math_library_num_threads(self, num_threads: int) -> None:
        """ONNX Runtime intra-op threads; ``num_threads=``."""
        self._set(num_threads=num_threads)

    def switch_backend(self, backend: str) -> None:
        """"onnxruntime" or "torch"; ``backend=``."""
        self._set(backend=backend)

    def switch_ir_optim(self, enabled: bool = True) -> None:
        """Paddle's switch for graph-level fusion passes; here onnxscript's ONNX Runtime fusions, ``fuse=``."""
        self._set(fuse=enabled)

    def enable_use_gpu(self, memory_pool_init_size_mb: int = 100, device_id: int = 0) -> None:
        """Run on GPU ``device_id`` (``device="cuda:N"``); Paddle's signature.

        ``memory_pool_init_size_mb`` is accepted, so Paddle code runs unchanged, and ignored: Paddle
        reserves a pool of that size up front, while torch's CUDA caching allocator and ONNX Runtime's
        CUDA arena both grow on demand and reuse what they freed, so there is nothing to size here.
        Like every setter it checks the spelling only; ``create_predictor`` checks that the GPU is there.
        """
        if isinstance(memory_pool_init_size_mb, bool) or not isinstance(memory_pool_init_size_mb, (int, float)) \
                or memory_pool_init_size_mb < 0:
            raise ValueError(f"memory_pool_init_size_mb must be a number of MB >= 0, got {memory_pool_init_size_mb!r}")
        if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
            raise ValueError(f"device_id must be a GPU index (an int >= 0), got {device_id!r}")
        self._set(device=f"cuda:{device_id}")

    def disable_gpu(self) -> None:
        """Run on the CPU (``device="cpu"``)."""
        self._set(device="cpu")

    def use_gpu(self) -> bool:
        """Whether this config asks for a GPU ("cuda" / "cuda:N"). False for "auto", which lets the
        predictor decide: ``Predictor.device`` says where it runs."""
        return is_gpu(self.device)

    def gpu_device_id(self) -> int:
        """The GPU index this config names: N of "cuda:N"; this process's ``LOCAL_RANK`` for "cuda"
        and "auto" (what they pick on a GPU machine); 0 for the CPU, as in Paddle."""
        return 0 if self.device == "cpu" else cuda_index(self.device)

    def _set(self, **changes: Any) -> None:
        old = {k: getattr(self, k) for k in changes}
        for k, v in changes.items():
            setattr(self, k, v)
        try:
            self.validate()
        except (ValueError, FileNotFoundError):
            for k, v in old.items():  # a rejected change leaves the config as it was
                setattr(self, k, v)
            raise

"""The two engines a Predictor runs on: ONNX Runtime (the ``.onnx``) and torch (the ``.pt2``)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sampan.inference.fused import ORT_DISABLED_OPTIMIZERS, fused_session


def ort_session_options(num_threads: int | None = None):
    """The ``onnxruntime.SessionOptions`` every sampan session starts from: every graph
    optimization on, ``num_threads`` intra-op threads (None: ONNX Runtime's default, one per core).
    Benchmarks that profile or compare graphs start from these too, so they time what ships."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    if num_threads is not None:
        options.intra_op_num_threads = num_threads
    return options


class OnnxRuntimeBackend:
    """An ``onnxruntime.InferenceSession`` on CPU with every graph optimization enabled but one
    (``sampan.inference.fused.ORT_DISABLED_OPTIMIZERS``, slower on CPU than without), on the graph
    with onnxscript's ONNX Runtime fusions applied (``sampan.inference.fused``, cached beside the
    export; ``fuse=False``: the file as exported).

    Attributes:
        fusions: how many of each fusion applied (empty when ``fuse`` is off or nothing matched).
    """

    def __init__(self, path: Path, input_names: Sequence[str], num_threads: int | None = None, fuse: bool = True):
        import onnxruntime

        options = ort_session_options(num_threads)
        self.fusions: dict[str, int] = {}
        self.session = None

        def open_session(graph: Path):
            # Without SkipLayerNormFusion: ORT's CPU kernel for it is slower than what it fuses
            # (sampan.inference.fused), on the exported graph as much as on the fused one.
            return onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"],
                                                disabled_optimizers=list(ORT_DISABLED_OPTIMIZERS))

        if fuse:
            try:
                self.session, self.fusions = fused_session(path, open_session)
            except Exception as e:  # noqa: BLE001 - the unfused graph computes the same; only slower
                warnings.warn(f"onnxscript's ONNX Runtime fusions failed on {path.name} ({type(e).__name__}: {e}); "
                              "running the graph as exported (Config(fuse=False) skips the attempt)", stacklevel=3)
        if self.session is None:
            self.session = open_session(path)
        found = [i.name for i in self.session.get_inputs()]
        if sorted(found) != sorted(input_names):
            raise ValueError(f"{path.name} takes inputs {found} but inference.json lists {list(input_names)}: "
                             "the files are from different exports; export the directory again")
        self._input_names = list(input_names)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, dict(zip(self._input_names, arrays, strict=True)))


class TorchBackend:
    """The ``torch.export`` program, loaded by ``sampan.jit.load`` (no Python source needed)."""

    def __init__(self, prefix: Path):
        from sampan.jit import load

        self.function = load(prefix, backend="pt2")

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        import torch

        with torch.no_grad():
            out = self.function(*(torch.from_numpy(a) for a in arrays))
        outs = out if isinstance(out, (tuple, list)) else [out]
        return [o.detach().cpu().numpy() for o in outs]

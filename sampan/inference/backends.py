"""The two engines a Predictor runs on: ONNX Runtime (the ``.onnx``) and torch (the ``.pt2``), each
on the CPU or a CUDA GPU (``sampan.inference.device`` decides which)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sampan.inference.device import check_session_providers, ort_providers
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
    """An ``onnxruntime.InferenceSession`` with every graph optimization enabled but one
    (``sampan.inference.fused.ORT_DISABLED_OPTIMIZERS``, slower on CPU than without), on the graph
    with onnxscript's ONNX Runtime fusions applied (``sampan.inference.fused``, cached beside the
    export; ``fuse=False``: the file as exported), on the CPU or, for a GPU ``device``, on ONNX
    Runtime's CUDA provider (``sampan.inference.device.ort_providers``).

    Attributes:
        fusions: how many of each fusion applied (empty when ``fuse`` is off or nothing matched).
        device: where the session runs, "cpu" or "cuda:N".
    """

    def __init__(self, path: Path, input_names: Sequence[str], num_threads: int | None = None, fuse: bool = True,
                 device: str = "cpu"):
        import onnxruntime

        # Before any session is made: a GPU this ONNX Runtime cannot use fails here, in one line.
        providers = ort_providers(device, onnxruntime.get_available_providers(), onnxruntime.__version__)
        options = ort_session_options(num_threads)
        self.fusions: dict[str, int] = {}
        self.session = None

        def open_session(graph: Path):
            # Without SkipLayerNormFusion: ORT's CPU kernel for it is slower than what it fuses
            # (sampan.inference.fused), on the exported graph as much as on the fused one. The fused
            # file holds standard and com.microsoft ops that the CUDA provider runs too.
            return onnxruntime.InferenceSession(str(graph), options, providers=providers,
                                                disabled_optimizers=list(ORT_DISABLED_OPTIMIZERS))

        if fuse:
            try:
                self.session, self.fusions = fused_session(path, open_session)
            except Exception as e:  # noqa: BLE001 - the unfused graph computes the same; only slower
                warnings.warn(f"onnxscript's ONNX Runtime fusions failed on {path.name} ({type(e).__name__}: {e}); "
                              "running the graph as exported (Config(fuse=False) skips the attempt)", stacklevel=3)
        if self.session is None:
            self.session = open_session(path)
        self.device = check_session_providers(device, providers, self.session.get_providers())
        found = [i.name for i in self.session.get_inputs()]
        if sorted(found) != sorted(input_names):
            raise ValueError(f"{path.name} takes inputs {found} but inference.json lists {list(input_names)}: "
                             "the files are from different exports; export the directory again")
        self._input_names = list(input_names)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.session.run(None, dict(zip(self._input_names, arrays, strict=True)))


def load_program(path: Path, device):
    """The ``torch.export`` program at ``path`` as a callable module on ``device`` (a ``torch.device``).

    Off the CPU the program is moved by ``torch.export.passes.move_to_device_pass`` before
    ``.module()``: export bakes the device of tensors made inside ``forward`` (``torch.arange(...,
    device=x.device)`` becomes a ``device=cpu`` argument in the graph), and ``.module().to(device)``
    would move the weights but leave those on the CPU, so the first op mixing them would fail.
    """
    import torch

    program = torch.export.load(path)
    if device.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    return program.module()


class TorchBackend:
    """The ``torch.export`` program (no Python source needed), on the CPU or a GPU: inputs go to
    its device, outputs come back as CPU numpy arrays.

    Attributes:
        device: where it runs, "cpu" or "cuda:N".
    """

    def __init__(self, path: Path, device: str = "cpu"):
        from sampan.utils.device import resolve_device

        self._device = resolve_device(device)  # no GPU there: a DeviceError saying what there is
        self.device = str(self._device)
        self.function = load_program(path, self._device)

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        import torch

        with torch.no_grad():
            out = self.function(*(torch.from_numpy(a).to(self._device) for a in arrays))
        outs = out if isinstance(out, (tuple, list)) else [out]
        return [o.detach().cpu().numpy() for o in outs]

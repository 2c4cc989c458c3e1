"""Which device a Predictor runs on, per backend: the decisions, kept apart from the sessions.

A predictor's device is a spec as everywhere in sampan (``sampan.utils.device``): "cpu", "auto",
"cuda" or "cuda:N" (Paddle's "gpu" / "gpu:N" too). The two backends find a GPU differently:

* torch (the ``.pt2``): ``sampan.utils.device.resolve_device``, i.e. what torch sees.
* ONNX Runtime (the ``.onnx``): its ``CUDAExecutionProvider``, which only the ``onnxruntime-gpu``
  wheel has; the plain ``onnxruntime`` wheel is CPU only, whatever torch sees. So "auto" is the
  GPU when that provider is there and the CPU otherwise, and an explicit "cuda" without it is a
  ``DeviceError`` naming the wheel to install.

The choices are plain functions of (spec, what is installed), so they are tested on any machine;
only :func:`predictor_device` and the backends look at the installed libraries. The spec is
checked by ``sampan.utils.device.check_device_spec``, which imports no torch (a deployed Taskflow
on ONNX Runtime imports none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sampan.utils.device import DeviceError, check_device_spec, local_rank

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


def is_gpu(device: str) -> bool:
    """Whether the (normalised) spec asks for a GPU outright ("cuda" / "cuda:N"; not "auto")."""
    return device == "cuda" or device.startswith("cuda:")


def cuda_index(device: str) -> int:
    """The GPU a "cuda" / "cuda:N" / "auto" spec means: N, or this process's rank on its node
    (``LOCAL_RANK``; 0 for a lone process), as ``sampan.utils.device.resolve_device`` reads it."""
    if device.startswith("cuda:"):
        return int(device.split(":", 1)[1])
    return local_rank()


def no_cuda_provider_message(device: str, available: Sequence[str], version: str = "") -> str:
    """Why an ONNX Runtime predictor cannot run on ``device``, and the three ways out."""
    have = ", ".join(available) or "none"
    which = f"onnxruntime {version}" if version else "onnxruntime"
    return (f"device {device!r} asked for, but {which} here has no {CUDA_PROVIDER} (its providers: {have}): "
            "pip install onnxruntime-gpu in place of onnxruntime (uninstall onnxruntime first; both install the "
            "same module), or run the .pt2 program on the GPU with backend='torch', or use device 'cpu'")


def ort_providers(device: str, available: Sequence[str], version: str = "") -> list[Any]:
    """The ``providers=`` list for ``onnxruntime.InferenceSession`` that runs on ``device``, given
    ``available`` (``onnxruntime.get_available_providers()``).

    "cpu": the CPU provider only. "cuda" / "cuda:N": the CUDA provider on that GPU
    (``{"device_id": N}``), then the CPU provider, which takes the few nodes CUDA has no kernel for
    (ONNX Runtime places each node on the first provider that runs it); a ``DeviceError`` when
    ``available`` has no CUDA provider. "auto": the CUDA list when the provider is there, else the CPU.
    """
    device = check_device_spec(device)
    if device == "cpu" or (device == "auto" and CUDA_PROVIDER not in available):
        return [CPU_PROVIDER]
    if CUDA_PROVIDER not in available:
        raise DeviceError(no_cuda_provider_message(device, available, version))
    return [(CUDA_PROVIDER, {"device_id": cuda_index(device)}), CPU_PROVIDER]


def check_session_providers(device: str, providers: Sequence[Any], used: Sequence[str]) -> str:
    """Where a session made with ``providers`` runs, given ``used`` (its ``get_providers()``):
    "cuda:N" or "cpu".

    ONNX Runtime does not fail when the CUDA provider cannot start (no driver, no GPU, a missing
    CUDA / cuDNN library): it logs the reason and runs on the CPU. For an explicit "cuda" spec that
    silent fallback is a ``DeviceError`` here; for "auto" it is the answer.
    """
    wanted = [p for p in providers if isinstance(p, tuple) and p[0] == CUDA_PROVIDER]
    if wanted and CUDA_PROVIDER in used:
        return f"cuda:{wanted[0][1]['device_id']}"
    if wanted and is_gpu(check_device_spec(device)):
        raise DeviceError(f"device {device!r}: ONNX Runtime has its {CUDA_PROVIDER} but could not start it on "
                          f"GPU {wanted[0][1]['device_id']} (no NVIDIA driver, no such GPU, or CUDA / cuDNN "
                          "libraries that do not match onnxruntime-gpu; its log above says which): fix that, or "
                          "use device 'cpu'")
    return "cpu"


def predictor_device(device: str, backend: str) -> str:
    """The device a predictor on ``backend`` would run on for the spec ``device``, as "cpu" or
    "cuda:N"; a ``DeviceError`` naming the fix when it asks for a GPU this machine's ``backend``
    cannot use. Cheap (no model is loaded), so callers check before a slow export."""
    device = check_device_spec(device)
    if device == "cpu":
        return "cpu"
    if backend == "torch":
        from sampan.utils.device import resolve_device

        return str(resolve_device(device))
    import onnxruntime

    providers = ort_providers(device, onnxruntime.get_available_providers(), onnxruntime.__version__)
    return "cpu" if providers == [CPU_PROVIDER] else f"cuda:{providers[0][1]['device_id']}"

"""Which device a run uses: one spelling for every entry point (``device=`` / ``--device``).

A device spec is one of

* ``"auto"``: this process's CUDA GPU when torch sees one, else the CPU. Under ``torchrun`` /
  ``sampan launch`` "this process's GPU" is ``cuda:$LOCAL_RANK``, so each rank of a node takes its
  own GPU; a lone process takes ``cuda:0``.
* ``"cpu"``.
* ``"cuda"``: this process's GPU as for "auto", but an error when there is none.
* ``"cuda:N"``: GPU N of this node.

Paddle's spellings ``"gpu"`` and ``"gpu:N"`` mean the same as ``"cuda"`` / ``"cuda:N"``.
``check_device_spec`` validates the spelling only (configs call it, on any machine, and it imports
no torch, so a torch-free ONNX Runtime deployment can use it);
``resolve_device`` turns a spec into the ``torch.device`` to run on, and asking for a GPU that is
not there is a ``DeviceError`` in one line that says what there is and what to do.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICE_SPECS = "auto, cpu, cuda or cuda:N"
_SPEC = re.compile(r"^(auto|cpu|cuda|gpu)(?::(\d+))?$")


class DeviceError(ValueError):
    """A device spec that is misspelt, or names a device this machine does not have."""


def check_device_spec(spec: str | torch.device) -> str:
    """``spec`` normalised (lower case, Paddle's "gpu" as "cuda"); a ``DeviceError`` if it is not one
    of auto / cpu / cuda / cuda:N. Looks at no hardware."""
    if not isinstance(spec, str) and type(spec).__name__ == "device" and hasattr(spec, "index"):
        spec = str(spec)  # a torch.device (checked by duck type: this module imports no torch here)
    if not isinstance(spec, str):
        raise DeviceError(f"device must be a string ({DEVICE_SPECS}), got {type(spec).__name__} {spec!r}")
    match = _SPEC.match(spec.strip().lower())
    if match is None or (match.group(2) is not None and match.group(1) in ("auto", "cpu")):
        raise DeviceError(f"device {spec!r} is not one of {DEVICE_SPECS}")
    kind, index = match.groups()
    kind = "cuda" if kind == "gpu" else kind
    return kind if index is None else f"{kind}:{int(index)}"


def local_rank() -> int:
    """This process's rank on its node, as the launcher set it (0 for a lone process)."""
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The ``torch.device`` that ``spec`` names on this machine (see the module docstring)."""
    import torch

    spec = check_device_spec(spec)
    if spec == "cpu":
        return torch.device("cpu")
    count = _cuda_count()
    if spec == "auto" and count == 0:
        return torch.device("cpu")
    if count == 0:
        raise DeviceError(
            f"device {spec!r} asked for, but torch {torch.__version__} sees no CUDA GPU "
            f"({'a CPU-only build of torch' if torch.version.cuda is None else 'no driver or no visible GPU'}); "
            "use device 'cpu' or 'auto', or install a CUDA build of torch on a machine with a GPU")
    index = local_rank() if ":" not in spec else int(spec.split(":")[1])
    if index >= count:
        where = "LOCAL_RANK=" + str(index) + " picks" if ":" not in spec else "that is"
        raise DeviceError(f"device {spec!r}: {where} GPU {index}, but this machine has {count} CUDA GPU"
                          f"{'s' if count > 1 else ''} (cuda:0..cuda:{count - 1}); "
                          "start fewer processes per node or name an existing GPU")
    return torch.device("cuda", index)


def device_of(module: torch.nn.Module) -> torch.device:
    """Where ``module``'s first parameter (or buffer) lives; the CPU for a module with neither."""
    import torch

    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return torch.device("cpu")

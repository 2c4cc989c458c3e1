"""Capture and restore every random number generator a training step draws from.

Bit-exact resume needs the generators where they were at the save, not merely re-seeded: dropout
masks, data shuffles and augmentation all draw from them. The captured dict holds only types
``flatten_state`` stores (tuples, ints, floats, numpy and torch tensors), so it goes into a
checkpoint's ``trainer_state`` as is. In a multi-process job each rank has its own generators;
save one capture per rank.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch


def capture_rng_state() -> dict[str, Any]:
    """The states of Python's ``random``, NumPy's global generator, torch's CPU generator and, when
    CUDA is available, each CUDA device's generator (under ``"cuda"``, one uint8 tensor per device)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        # The dict form names its fields ({"bit_generator", "state": {"key", "pos"}, ...}), which
        # reads better in the checkpoint's JSON than the legacy 5-tuple; set_state takes both.
        "numpy": np.random.get_state(legacy=False),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put the generators back where ``capture_rng_state`` found them.

    CUDA states are restored only where CUDA is available; if the device count differs from the
    capture (a resume on another machine shape), the common devices are restored and a warning says
    the run is no longer bit-exact.

    Raises:
        ValueError: ``state`` lacks the python, numpy or torch entry, or one has the wrong shape.
    """
    missing = [key for key in ("python", "numpy", "torch") if key not in state]
    if missing:
        raise ValueError(f"RNG state is missing {missing}; expected the dict capture_rng_state() returns")
    try:
        version, internal, gauss_next = state["python"]
        # setstate insists on tuples, and a state that went through JSON without sampan's codec has lists.
        random.setstate((int(version), tuple(int(word) for word in internal), gauss_next))
    except (TypeError, ValueError) as error:
        raise ValueError(f"RNG state 'python' is not a random.getstate() value: {error}") from error
    np.random.set_state(state["numpy"])
    cpu = state["torch"]
    if not isinstance(cpu, torch.Tensor) or cpu.dtype != torch.uint8:
        raise ValueError("RNG state 'torch' must be the uint8 tensor torch.get_rng_state() returns")
    torch.set_rng_state(cpu.cpu())
    _restore_cuda(state.get("cuda"))


def _restore_cuda(states: list[torch.Tensor] | None) -> None:
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if states is None:
        if available:
            warnings.warn(
                "the RNG state holds no CUDA generators (captured without CUDA); CUDA RNG left as is",
                stacklevel=3,
            )
        return
    if len(states) != available:
        warnings.warn(
            f"the RNG state holds {len(states)} CUDA generator(s) but {available} CUDA device(s) are visible: "
            f"restoring the first {min(len(states), available)}; random draws on the GPU will differ from "
            "the original run",
            stacklevel=3,
        )
    for device, device_state in enumerate(states[:available]):
        torch.cuda.set_rng_state(device_state.cpu(), device)

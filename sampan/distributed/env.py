"""Starting torch.distributed from a launcher's environment (torchrun / sampan launch), or alone."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from sampan.utils.device import local_rank


def launched() -> bool:
    """Whether a launcher set this process up as one rank of a group."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


_DEVICE: torch.device | None = None


def use_device(device: torch.device | str | None) -> None:
    """Run this process's collectives and mesh on ``device`` (None: the default, CUDA when there
    is one). Set before the process group starts; a Trainer with ``device="cpu"`` sets it on a GPU
    machine so its job runs on gloo."""
    global _DEVICE
    _DEVICE = None if device is None else torch.device(device)


def default_device_type() -> str:
    """"cuda" or "cpu": where this process's mesh and collectives live."""
    if _DEVICE is not None:
        return _DEVICE.type
    return "cuda" if torch.cuda.is_available() else "cpu"


def local_device() -> torch.device:
    """This rank's device: its node-local GPU (``cuda:$LOCAL_RANK``, or the one ``use_device``
    named) on CUDA, else the CPU."""
    if default_device_type() != "cuda":
        return torch.device("cpu")
    if _DEVICE is not None and _DEVICE.index is not None:
        return _DEVICE
    return torch.device("cuda", local_rank())


def init_process_group(timeout_s: float = 300.0) -> None:
    """Join the launcher's process group (gloo on CPU, nccl with ``device_id`` on GPU); a lone
    process makes a group of one.

    Idempotent. The timeout bounds every collective, so a mistake on one rank ends the run with an
    error instead of a hang.
    """
    if dist.is_initialized():
        return
    backend = "nccl" if default_device_type() == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if launched():
        if backend == "nccl":
            # device_id binds the group to this rank's GPU at once (NCCL's communicator is created
            # eagerly, and no collective can land on another rank's GPU by accident).
            device = local_device()
            torch.cuda.set_device(device)
            dist.init_process_group(backend=backend, timeout=timeout, device_id=device)
        else:
            dist.init_process_group(backend=backend, timeout=timeout)
    else:
        # A single process still gets a real (one-rank) group, so the same code path runs everywhere.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))


def shutdown(exit_code: int = 0) -> None:
    """End a distributed script: destroy the process group, flush, and leave at once.

    gloo groups sometimes abort in interpreter teardown after all work is done ("terminate
    called without an active exception", seen with 8 ranks); leaving with ``os._exit`` right after
    ``destroy_process_group`` avoids it. Call it as the last line of a training script.
    """
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)

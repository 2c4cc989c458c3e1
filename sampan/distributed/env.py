"""Starting torch.distributed from a launcher's environment (torchrun / sampan launch), or alone."""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def launched() -> bool:
    """Whether a launcher set this process up as one rank of a group."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def init_process_group(timeout_s: float = 300.0) -> None:
    """Join the launcher's process group (gloo on CPU, nccl on GPU); a lone process makes a group of one.

    Idempotent. The timeout bounds every collective, so a mistake on one rank ends the run with an
    error instead of a hang.
    """
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if launched():
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
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

"""Distributed checkpoints through torch DCP, keyed by the model's own parameter names.

Every rank writes its shards; the names are those of the unsplit model (tensor parallel and FSDP2
keep them), so a checkpoint saved at one layout loads at another (dp2 x mp2 -> mp2, -> sharding2,
-> one process): DCP reshards on load. Writes go to a temporary sibling directory that rank 0
renames into place after every rank has finished, so a crash never leaves a half-written
checkpoint where a loader would look.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def _unwrap(model: nn.Module) -> nn.Module:
    if getattr(model, "_pipeline", None) is not None:
        raise ValueError("distributed checkpoints of pipeline-parallel models are not implemented yet "
                         "(stage parameter names differ from the model's); save with pp_degree=1 for now")
    return getattr(model, "model", model)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _state(model: nn.Module, optimizer) -> tuple[nn.Module, object, dict]:
    """``(module, torch optimizer or None, {"model": ..., "optimizer": ...})`` keyed by the model's names."""
    module = _unwrap(model)
    torch_opt = optimizer.torch_optimizer if optimizer is not None else None
    model_sd, optim_sd = get_state_dict(module, torch_opt if torch_opt is not None else [])
    state = {"model": model_sd, "optimizer": optim_sd} if torch_opt is not None else {"model": model_sd}
    return module, torch_opt, state


def save_distributed(path: str | os.PathLike, model: nn.Module, optimizer=None) -> Path:
    """Write model (and optimizer) state of every rank to the directory ``path``."""
    target = Path(path)
    tmp = target.with_name(f".tmp-{target.name}")
    _, _, state = _state(model, optimizer)
    rank0 = not _distributed() or dist.get_rank() == 0
    if rank0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
    if _distributed():
        dist.barrier()
    dcp.save(state, checkpoint_id=str(tmp))
    if _distributed():
        dist.barrier()
    if rank0:
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    if _distributed():
        dist.barrier()
    return target


def load_distributed(path: str | os.PathLike, model: nn.Module, optimizer=None) -> None:
    """Load ``path`` into ``model`` (and ``optimizer``) at whatever layout they have now."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"{path} is not a distributed checkpoint directory")
    module, torch_opt, state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=str(path))
    if torch_opt is not None:
        set_state_dict(module, torch_opt, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    else:
        set_state_dict(module, [], model_state_dict=state["model"], optim_state_dict={})

"""Data parallelism and ZeRO sharding through FSDP2 (``fully_shard``) on the dp x sharding mesh.

The 2-D mesh ``(dp, sharding)`` gives HSDP: parameters are replicated across ``dp`` and sharded
across ``sharding``. ``dp`` alone is plain data parallelism (shard groups of one).

ZeRO stages map onto FSDP2 as follows:

* stage 3 shards parameters, gradients and optimizer state; parameters are gathered for forward
  and again for backward (``reshard_after_forward=True``).
* stage 2 keeps the gathered parameters from forward to backward (``reshard_after_forward=False``);
  gradients and optimizer state are sharded.
* stage 1 runs as stage 2. FSDP2 always reduce-scatters gradients, so it has no "sharded
  optimizer state with full gradients" mode; stage 2 moves the same bytes (reduce-scatter +
  all-gather = one all-reduce) and holds less memory, so nothing is lost.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from sampan.nn.transformer import TransformerBlock


def shard_units(model: nn.Module) -> list[nn.Module]:
    """Modules that become their own FSDP unit (gathered one at a time): the transformer blocks."""
    blocks = [m for m in model.modules() if isinstance(m, TransformerBlock)]
    if blocks:
        return blocks
    return [child for m in model.modules() if isinstance(m, nn.ModuleList) for child in m]


def expert_shard_placement(param: nn.Parameter, ranks: int) -> Shard:
    """Where FSDP2 cuts a stacked expert weight ``[E_local, ...]`` over ``ranks`` expert-data ranks:
    along the first dimension they divide evenly. FSDP2's default ``Shard(0)`` pads every rank to
    ``ceil(E_local / ranks)`` experts, so 4 local experts over 8 ranks would cost each rank half an
    expert's state, not an eighth. When no dimension divides (ERNIE-4.5-300B's 8 local experts of
    ``[7168, 8192]`` over 21 ranks) it stays ``Shard(0)``, padded; ``sampan plan`` prices that."""
    # Expert parallelism has already cut the experts: what FSDP2 splits is this rank's slice.
    shape = param.to_local().shape if isinstance(param, DTensor) else param.shape
    for dim, size in enumerate(shape):
        if size % ranks == 0:
            return Shard(dim)
    return Shard(0)  # FSDP2 shards only the first dimension unevenly (padding the last ranks)


def apply_sharding(model: nn.Module, mesh: DeviceMesh, stage: int,
                   mp_policy: MixedPrecisionPolicy | None = None, experts: Sequence[nn.Module] = (),
                   expert_mesh: DeviceMesh | None = None) -> nn.Module:
    """``fully_shard`` each block, then the root (embeddings, norms, head) over ``mesh``.

    ``mp_policy``: FSDP2's mixed precision (``sampan.distributed.precision``), None for none.
    ``experts``: expert-parallel experts modules, sharded first, on their own over ``expert_mesh``
    (the expert-data-parallel ranks), so the blocks around them leave their weights alone.
    """
    if stage not in (1, 2, 3):
        raise ValueError(f"sharding stage must be 1, 2 or 3, got {stage}")
    reshard = stage == 3
    extra = {"mp_policy": mp_policy} if mp_policy is not None else {}
    for unit in experts:
        fully_shard(unit, mesh=expert_mesh, reshard_after_forward=reshard,
                    shard_placement_fn=functools.partial(expert_shard_placement, ranks=expert_mesh.shape[-1]), **extra)
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, **extra)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, **extra)
    return model

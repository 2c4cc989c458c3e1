"""The hybrid-parallel topology: one ``DeviceMesh`` with named axes pp x dp x sharding x cp x mp.

The order puts tensor parallelism (``mp``, the most communication-heavy axis) on neighbouring
ranks, which a launcher places on the same node, context parallelism (a key / value gather per
layer) next to it, and pipeline stages (the lightest) furthest apart, as Megatron does.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

AXES = ("pp", "dp", "sharding", "cp", "mp")


class HybridCommunicateGroup:
    """Ranks, sizes and process groups of each parallel axis (Paddle's ``HybridCommunicateGroup``).

    Args:
        degrees: ``{"pp": .., "dp": .., "sharding": .., "cp": .., "mp": ..}`` whose product is the world
            size (a missing ``cp`` is 1).
        device_type: "cpu" (gloo) or "cuda" (nccl).
    """

    def __init__(self, degrees: dict[str, int], device_type: str = "cpu"):
        shape = tuple(int(degrees.get(axis, 1)) for axis in AXES)
        world = dist.get_world_size()
        product = 1
        for d in shape:
            product *= d
        if product != world:
            raise ValueError(f"degrees {dict(zip(AXES, shape, strict=True))} multiply to {product}, "
                             f"but the world size is {world}")
        self.degrees = dict(zip(AXES, shape, strict=True))
        self.mesh: DeviceMesh = init_device_mesh(device_type, shape, mesh_dim_names=AXES)
        # The axis FSDP2 shards over. Sharding and context-parallel ranks both split the model
        # state, so with both it is their product, flattened into one named axis (a collective:
        # every rank does it here, once).
        if self.degrees["cp"] == 1 or self.degrees["sharding"] == 1:
            self._shard_axis = "cp" if self.degrees["cp"] > 1 else "sharding"
        else:
            self._shard_axis = "sharding_cp"
            self.mesh["sharding", "cp"]._flatten(self._shard_axis)

    def _rank(self, axis: str) -> int:
        return self.mesh.get_local_rank(axis)

    def _group(self, axis: str):
        return self.mesh.get_group(axis)

    # Paddle-style accessors --------------------------------------------------------------------
    def get_global_rank(self) -> int:
        return dist.get_rank()

    def get_data_parallel_rank(self) -> int:
        return self._rank("dp")

    def get_data_parallel_world_size(self) -> int:
        return self.degrees["dp"]

    def get_data_parallel_group(self):
        return self._group("dp")

    def get_model_parallel_rank(self) -> int:
        return self._rank("mp")

    def get_model_parallel_world_size(self) -> int:
        return self.degrees["mp"]

    def get_model_parallel_group(self):
        return self._group("mp")

    def get_stage_id(self) -> int:
        return self._rank("pp")

    def get_pipe_parallel_world_size(self) -> int:
        return self.degrees["pp"]

    def get_pipe_parallel_group(self):
        return self._group("pp")

    def get_sharding_parallel_rank(self) -> int:
        return self._rank("sharding")

    def get_sharding_parallel_world_size(self) -> int:
        return self.degrees["sharding"]

    def get_sharding_parallel_group(self):
        return self._group("sharding")

    def get_context_parallel_rank(self) -> int:
        return self._rank("cp")

    def get_context_parallel_world_size(self) -> int:
        return self.degrees["cp"]

    def get_context_parallel_group(self):
        return self._group("cp")

    # What the data loader needs ------------------------------------------------------------------
    @property
    def data_world_size(self) -> int:
        """Ranks that see different data: dp x sharding (mp and pp ranks share their batch)."""
        return self.degrees["dp"] * self.degrees["sharding"]

    @property
    def data_rank(self) -> int:
        """This rank's index among the ``data_world_size`` data shards."""
        return self._rank("dp") * self.degrees["sharding"] + self._rank("sharding")

    @property
    def grad_world_size(self) -> int:
        """Ranks whose gradients of one parameter shard are averaged: the data ranks, times the
        context-parallel ranks (each computed its gradient from part of every sequence)."""
        return self.data_world_size * self.degrees["cp"]

    def data_mesh(self) -> DeviceMesh:
        """The mesh FSDP2 shards over: ``(dp, sharding x cp)`` (HSDP: replicate x shard), or 1-D
        ``sharding x cp`` when dp is 1, so no collective runs over a group of one rank.

        Context-parallel ranks share the sharded model state, as torchtitan's ``dp_shard_cp`` does:
        they hold the same parameters and each computes part of every gradient."""
        shard = self._shard_axis
        if self.degrees["dp"] == 1:
            return self.mesh[shard]
        return self.mesh["dp", shard]

    def __repr__(self) -> str:
        coords = {axis: self._rank(axis) for axis in AXES}
        return f"HybridCommunicateGroup(degrees={self.degrees}, rank={dist.get_rank()}, coords={coords})"

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
        ep_degree: expert parallel ranks, carved out of the data ranks (dp x sharding, which it must
            divide); see :meth:`expert_mesh`.
    """

    def __init__(self, degrees: dict[str, int], device_type: str = "cpu", ep_degree: int = 1):
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
        self.ep_degree = int(ep_degree)
        self._ep_mesh = self._build_expert_mesh(device_type) if self.ep_degree > 1 else None

    def _build_expert_mesh(self, device_type: str) -> DeviceMesh:
        """The mesh ``pp x edp_replicate x edp_shard x ep x cp x mp``: the data ranks (``dp x sharding``,
        data rank = dp rank x sharding + sharding rank) cut into groups of ``ep`` neighbours, taken
        out of the sharding ranks first, then the dp ranks (as ERNIE 4.5 carves its ep 8 out of its
        sharding group). What is left of the sharding axis shards the experts' state (ZeRO), the
        rest of dp replicates it (HSDP), as for the dense weights."""
        d, ep = self.degrees, self.ep_degree
        data = d["dp"] * d["sharding"]
        if data % ep:
            raise ValueError(f"ep_degree {ep} does not divide the data ranks dp {d['dp']} x sharding "
                             f"{d['sharding']} = {data}; use an ep_degree that divides {data}")
        shard = d["sharding"] // ep if d["sharding"] % ep == 0 else 1
        if shard == 1 and ep % d["sharding"]:  # ep takes whole sharding groups when it outgrows one
            raise ValueError(f"ep_degree {ep} neither divides sharding_degree {d['sharding']} nor is a multiple "
                             "of it, so its groups cannot be neighbouring data ranks; choose one that is")
        replicate = data // (shard * ep)
        ranks = self.mesh.mesh.reshape(d["pp"], replicate, shard, ep, d["cp"], d["mp"])
        names = ("pp", "edp_replicate", "edp_shard", "ep", "cp", "mp")
        mesh = DeviceMesh(device_type, ranks, mesh_dim_names=names)
        self._expert_sizes = {"edp_replicate": replicate, "edp_shard": shard}
        if d["cp"] > 1 and shard > 1:
            self._expert_shard_axis = "edp_shard_cp"
            mesh["edp_shard", "cp"]._flatten(self._expert_shard_axis)
        else:
            self._expert_shard_axis = "cp" if d["cp"] > 1 else "edp_shard"
        return mesh

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

    def get_expert_parallel_rank(self) -> int:
        """This rank's place in its expert parallel group (0 when ep_degree is 1)."""
        return self._ep_mesh.get_local_rank("ep") if self._ep_mesh is not None else 0

    def get_expert_parallel_world_size(self) -> int:
        return self.ep_degree

    def get_expert_parallel_group(self):
        """The group the tokens' all-to-all runs over; None when ep_degree is 1."""
        return self._ep_mesh.get_group("ep") if self._ep_mesh is not None else None

    def expert_mesh(self) -> DeviceMesh | None:
        """The 1-D ``ep`` mesh the experts are split over (``Shard(0)``), None when ep_degree is 1."""
        return self._ep_mesh["ep"] if self._ep_mesh is not None else None

    @property
    def expert_data_world_size(self) -> int:
        """Ranks holding the same experts and seeing different data: dp x sharding / ep."""
        return self.data_world_size // self.ep_degree

    def expert_data_mesh(self) -> DeviceMesh | None:
        """The mesh FSDP2 shards the experts over, the experts' counterpart of :meth:`data_mesh`:
        ``(edp_replicate, edp_shard x cp)``, or 1-D when nothing is left of dp; None at ep_degree 1."""
        if self._ep_mesh is None:
            return None
        shard = self._expert_shard_axis
        if self._expert_sizes["edp_replicate"] == 1:
            return self._ep_mesh[shard]
        return self._ep_mesh["edp_replicate", shard]

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

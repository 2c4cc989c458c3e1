"""``CommCounter``: what a block of code really sends, measured at the collective calls.

    with CommCounter() as comm:
        model.train_batch(batch, optimizer)
    comm.totals()   # {"all_reduce": {"calls": 7, "payload_bytes": ..., "wire_bytes": ...}, ...}

Every collective of ``torch.distributed`` goes through a dispatcher op (``c10d.*`` for the
process-group API that FSDP2 and pipelining use, ``_c10d_functional.*`` for DTensor's functional
collectives), so a ``TorchDispatchMode`` sees them all with their tensors and process group,
whatever library issued them. Nothing is estimated: the sizes are the tensors handed to the op.

Two numbers per op, per rank:

* ``payload_bytes``: the buffer the op works on, as nccl-tests size it (all-reduce's buffer,
  all-gather's output, reduce-scatter's input, the bytes a send sends).
* ``wire_bytes``: what each rank puts on the wire with ring algorithms, ``payload x factor``:
  all-reduce ``2(n-1)/n``, all-gather / reduce-scatter / all-to-all ``(n-1)/n``, send ``1``
  (a receive is counted at its sender), broadcast ``(n-1)/n``.

Collectives over a group of one rank move nothing and are left out.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

# op name -> (kind, how to find the payload). Payload rules: "first" = the tensors of the first
# argument, "input" = the second argument (reduce-scatter's input), "times_group" = the first
# argument times the group size (a functional all-gather's input), "none" = counted elsewhere.
_C10D = {
    "allreduce_": ("all_reduce", "first"),
    "allreduce_coalesced_": ("all_reduce", "first"),
    "_allgather_base_": ("all_gather", "first"),
    "allgather_": ("all_gather", "first"),
    "allgather_into_tensor_coalesced_": ("all_gather", "first"),
    "_reduce_scatter_base_": ("reduce_scatter", "input"),
    "reduce_scatter_": ("reduce_scatter", "input"),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "input"),
    "alltoall_base_": ("all_to_all", "input"),
    "broadcast_": ("broadcast", "first"),
    "send": ("send", "first"),
    "recv_": ("recv", "none"),
    "recv_any_source_": ("recv", "none"),
}
_FUNCTIONAL = {
    "all_reduce": ("all_reduce", "first"),
    "all_reduce_": ("all_reduce", "first"),
    "all_reduce_coalesced": ("all_reduce", "first"),
    "all_gather_into_tensor": ("all_gather", "times_group"),
    "all_gather_into_tensor_coalesced": ("all_gather", "times_group"),
    "reduce_scatter_tensor": ("reduce_scatter", "first"),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", "first"),
    "all_to_all_single": ("all_to_all", "first"),
    "broadcast": ("broadcast", "first"),
}
_NOT_COMMUNICATION = {"wait_tensor", "_wrap_tensor_autograd"}


def wire_factor(kind: str, group_size: int) -> float:
    """Bytes on the wire per payload byte, per rank, for ring algorithms on ``group_size`` ranks."""
    n = group_size
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        return (n - 1) / n
    if kind == "send":
        return 1.0
    return 0.0


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _group_size(args: tuple, functional: bool) -> int:
    if functional:
        name = next(a for a in reversed(args) if isinstance(a, str))
        return dist.distributed_c10d._resolve_process_group(name).size()
    for arg in args:
        if isinstance(arg, torch.ScriptObject) and "ProcessGroup" in str(arg._type()):
            return dist.ProcessGroup.unbox(arg).size()
    return dist.get_world_size()


class CommCounter(TorchDispatchMode):
    """Counts every collective run inside the ``with`` block on this rank (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = defaultdict(int)
        self.payload: dict[str, int] = defaultdict(int)
        self.wire: dict[str, float] = defaultdict(float)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace = func.namespace
        if namespace in ("c10d", "_c10d_functional"):
            self._record(func, args, functional=namespace == "_c10d_functional")
        return func(*args, **(kwargs or {}))

    def _record(self, func, args: tuple, functional: bool) -> None:
        name = func._schema.name.split("::", 1)[1]
        if name in _NOT_COMMUNICATION:
            return
        kind, rule = (_FUNCTIONAL if functional else _C10D).get(name, (f"other:{name}", "first"))
        size = _group_size(args, functional)
        if size <= 1:
            return
        if rule == "none":
            payload = 0
        elif rule == "input":
            payload = _tensor_bytes(args[1])
        elif rule == "times_group":
            payload = _tensor_bytes(args[0]) * size
        else:
            payload = _tensor_bytes(args[0])
        self.calls[kind] += 1
        self.payload[kind] += payload
        self.wire[kind] += payload * wire_factor(kind, size)

    def totals(self) -> dict[str, dict[str, float]]:
        """``kind -> {"calls", "payload_bytes", "wire_bytes"}`` for this rank."""
        return {kind: {"calls": self.calls[kind], "payload_bytes": self.payload[kind], "wire_bytes": self.wire[kind]}
                for kind in sorted(self.calls)}

    @property
    def wire_bytes(self) -> float:
        """Everything this rank put on the wire."""
        return sum(self.wire.values())

"""Planned routing: the expert loads a simulation assumes in place of the router's choices.

A router's token counts are data: on fake tensors (``sampan simulate``) they have no values, and the
shapes that follow from them (how many copies each expert runs, how many cross each all-to-all)
cannot be known. Under :func:`planned_routing` the MoE blocks and the expert-parallel dispatch use
the loads ``sampan plan`` prices instead: every expert of a block gets an even share of the
``T k`` token copies, and the experts of the rank being simulated receive ``load_factor`` times
their share from every source rank (the busiest rank of an imbalanced router; with one expert-parallel
rank the factor changes nothing, as every copy is local). The tensors it returns are real (they hold
values), so a fake-tensor run can read them.

Outside a simulation nothing here is active and routing is the router's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

__all__ = ["PlannedRouting", "active_plan", "planned_routing"]


@dataclasses.dataclass(frozen=True)
class PlannedRouting:
    """Even expert loads, the receiving rank's stretched by ``load_factor`` (>= 1)."""

    load_factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.load_factor >= 1.0:
            raise ValueError(f"planned routing's load_factor must be >= 1 (the busiest rank over the mean), "
                             f"got {self.load_factor}")

    def counts(self, copies: int, num_experts: int) -> torch.Tensor:
        """``copies`` token copies split as evenly as they go over ``num_experts`` experts: int64 ``[E]``."""
        return _even(copies, num_experts)

    def received(self, counts: torch.Tensor, ep: int) -> torch.Tensor:
        """``[ep, E / ep]``: the copies each of the ``ep`` source ranks sends to this rank's experts,
        when each sends what this rank sends (``counts [E]``) stretched by ``load_factor``."""
        local = counts.shape[0] // ep
        per_source = round(self.load_factor * int(counts.sum()) / ep)
        row = _even(per_source, local)
        with unset_fake_temporarily():
            return row.expand(ep, local).contiguous()


def _even(total: int, parts: int) -> torch.Tensor:
    base, extra = divmod(int(total), parts)
    # Real even inside FakeTensorMode, whose factories would return a tensor without values.
    with unset_fake_temporarily():
        return torch.tensor([base + (i < extra) for i in range(parts)], dtype=torch.int64)


_ACTIVE: list[PlannedRouting] = []


def active_plan() -> PlannedRouting | None:
    """The planned routing in force, or None (route by the router)."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.contextmanager
def planned_routing(load_factor: float = 1.0) -> Iterator[PlannedRouting]:
    """Route every MoE block by :class:`PlannedRouting` inside the ``with`` (for simulations)."""
    plan = PlannedRouting(load_factor)
    _ACTIVE.append(plan)
    try:
        yield plan
    finally:
        _ACTIVE.pop()

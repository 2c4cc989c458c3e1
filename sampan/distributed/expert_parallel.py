"""Expert parallelism: each rank of an ``ep`` group holds ``E / ep`` experts, and tokens travel to them.

``hybrid_configs["ep_degree"]`` (Paddle's name) cuts the data ranks (dp x sharding) into groups of
``ep`` neighbours (``HybridCommunicateGroup.expert_mesh``). In every MoE block the router runs
on each rank's own tokens as before; only the experts module (a ``sampan.nn.moe_experts.
GroupedExperts``, called once per block with the token copies sorted by expert) is split:

* its two stacked weights become DTensors ``Shard(0)`` on the ``ep`` mesh (rank ``r`` keeps experts
  ``r * E/ep .. (r+1) * E/ep - 1``), so state dicts and DCP checkpoints still hold whole ``[E, ...]``
  tensors under the model's names, and FSDP2 shards them further over the expert-data-parallel
  ranks (torchtitan's ``dp_shard_mod_ep``);
* a forward pre-hook sends every token copy to the rank owning its expert: the ranks first swap
  how many copies each sends to each of the other's experts (an ``[E]`` int64 all-to-all), then the
  copies themselves (``all_to_all_single``, uneven splits), and re-sort what arrived (ordered by
  source rank, then expert) by local expert, the order ``GroupedExperts`` wants;
* a forward post-hook undoes the sort and sends each result back to the rank its token came from
  (the inverse all-to-all). The all-to-alls are differentiable: backward runs them in reverse.

No line of the MoE block changes: it still calls ``self.experts(x_sorted, counts)`` once.

Gradient scale. ``DistributedModel`` weights each rank's loss by the data ranks, and FSDP2 averages a
gradient over the ranks holding the parameter. A dense weight is held by all ``dp x sharding (x cp)``
ranks; an expert only by ``dp x sharding / ep (x cp)``, while its gradient already sums the tokens
of the whole ``ep`` group: averaged over ``ep`` times fewer ranks it would come out ``ep`` times too
large. So the local weights the experts compute with pass through an identity whose backward
multiplies by ``1 / ep`` (FSDP2's ``set_gradient_divide_factor`` would do the same, but needs
``ReduceOp.PREMUL_SUM``, which gloo lacks).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from sampan.models.registry import spec_of
from sampan.nn.moe_planned import active_plan

EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def expert_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every experts module expert parallelism splits.

    A sampan family names them (``parallelize.expert_parallel_modules(model)``); for a model sampan
    doesn't know, every ``sampan.nn.moe_experts.GroupedExperts`` in it.
    """
    from sampan.nn.moe_experts import GroupedExperts

    spec = spec_of(model)
    names = None
    if spec is not None:
        finder = getattr(spec.parallel(), "expert_parallel_modules", None)
        names = finder(model) if finder is not None else None
    if names is None:
        return [(name, m) for name, m in model.named_modules() if isinstance(m, GroupedExperts)]
    return [(name, model.get_submodule(name)) for name in names]


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``factor`` (see the module docstring)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


def _sort_by_local_expert(received: torch.Tensor) -> torch.Tensor:
    """The row order that turns copies received as (source rank, local expert) runs into
    (local expert, source rank) runs; ``received [ep, E_local]`` holds the run lengths."""
    counts = received.reshape(-1)
    starts = torch.cumsum(counts, 0) - counts  # where each (source, expert) run begins
    by_expert_counts = received.t().reshape(-1)
    by_expert_starts = starts.reshape(received.shape).t().reshape(-1)
    total = int(counts.sum())
    run = torch.repeat_interleave(torch.arange(by_expert_counts.numel()), by_expert_counts, output_size=total)
    run_begin = torch.cumsum(by_expert_counts, 0) - by_expert_counts
    return by_expert_starts[run] + (torch.arange(total) - run_begin[run])


class ExpertParallelDispatch:
    """The pre / post forward hooks of one experts module (see the module docstring).

    ``group``: the ``ep`` process group; ``num_experts``: all experts of the block (E).
    """

    def __init__(self, group, ep: int, num_experts: int):
        self.group = group
        self.ep = ep
        self.num_experts = num_experts
        self.local_experts = num_experts // ep
        self._pending: list[tuple[torch.Tensor, list[int], list[int]]] = []

    def _shadow_weights(self, module: nn.Module) -> None:
        # The experts' code reads ``self.gate_up_proj``: for this call it finds the local
        # ``[E/ep, ...]`` tensor (an instance attribute shadows ``_parameters``), whose gradient
        # flows back to the DTensor parameter, scaled by 1/ep.
        for name in EXPERT_WEIGHTS:
            weight = module._parameters[name]
            local = weight.to_local() if isinstance(weight, DTensor) else weight
            module.__dict__[name] = _ScaleGrad.apply(local, 1.0 / self.ep)

    @staticmethod
    def _unshadow_weights(module: nn.Module) -> None:
        for name in EXPERT_WEIGHTS:
            module.__dict__.pop(name, None)

    def dispatch(self, module: nn.Module, args: tuple) -> tuple:
        """Forward pre-hook: ``(x [N, h] sorted by expert, counts [E])`` -> this rank's experts' input."""
        x, counts = args
        if counts.shape[0] != self.num_experts:
            raise ValueError(f"expert parallel experts module got token counts for {counts.shape[0]} experts, "
                             f"expected all {self.num_experts} of the block (the MoE block sorts by global expert)")
        counts = counts.to(torch.int64)
        received = torch.empty_like(counts)
        # How many copies each rank sends to each of this rank's experts: [ep, E_local] after the swap.
        dist.all_to_all_single(received, counts, group=self.group)
        received = received.reshape(self.ep, self.local_experts)
        plan = active_plan()
        if plan is not None:  # a simulation: nothing arrived; the planned loads say what would have
            received = plan.received(counts, self.ep)
        send = counts.reshape(self.ep, self.local_experts).sum(1).tolist()
        recv = received.sum(1).tolist()
        tokens = all_to_all_single_autograd(x.contiguous(), recv, send, self.group)
        order = _sort_by_local_expert(received)
        self._pending.append((order, send, recv))
        self._shadow_weights(module)
        return tokens.index_select(0, order), received.sum(0)

    def combine(self, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        """Forward post-hook: results back in the order the tokens came, on the rank they came from."""
        self._unshadow_weights(module)
        order, send, recv = self._pending.pop()
        restored = torch.empty_like(order)
        restored[order] = torch.arange(order.numel())
        back = output.index_select(0, restored)
        return all_to_all_single_autograd(back.contiguous(), send, recv, self.group)


def apply_expert_parallel(modules: list[nn.Module], mesh: DeviceMesh) -> list[nn.Module]:
    """Split each experts module of ``modules`` over the 1-D ``ep`` ``mesh`` and hook its forward.

    Every rank must hold the same expert weights (same seed or checkpoint): rank ``r`` keeps the
    slice ``r`` of ``distribute_tensor``'s ``Shard(0)``. Returns the modules, for the caller to
    shard over the expert-data-parallel ranks.
    """
    ep = mesh.size()
    group = mesh.get_group()
    for module in modules:
        for name in EXPERT_WEIGHTS:
            if name not in module._parameters:
                raise ValueError(f"expert parallel needs a GroupedExperts-like module with parameters "
                                 f"{list(EXPERT_WEIGHTS)}; {type(module).__name__} has no {name!r}")
        num_experts = module._parameters["gate_up_proj"].shape[0]
        if num_experts % ep:
            raise ValueError(f"ep_degree {ep} does not divide the {num_experts} experts of "
                             f"{type(module).__name__}; choose an ep_degree dividing {num_experts}")
        if getattr(module, "_sampan_expert_parallel", None) is not None:
            raise ValueError("this experts module is already expert parallel")
        for name in EXPERT_WEIGHTS:
            weight = module._parameters[name]
            module._parameters[name] = nn.Parameter(distribute_tensor(weight.detach(), mesh, [Shard(0)]),
                                                    requires_grad=weight.requires_grad)
        hooks = ExpertParallelDispatch(group, ep, num_experts)
        module._sampan_expert_parallel = hooks
        module.register_forward_pre_hook(hooks.dispatch)
        module.register_forward_hook(hooks.combine)
    return modules


class DataRankSum:
    """The MoE blocks' load reducer under fleet: a tensor summed over the data ranks (dp, sharding)
    and the context-parallel ranks, each of which routed different tokens; tensor-parallel and
    pipeline ranks are left out (they share their tokens, or hold other layers). Not
    differentiable: it reduces expert loads (counts)."""

    def __init__(self, groups: list):
        self.groups = groups

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach().clone()
        for group in self.groups:
            dist.all_reduce(tensor, group=group)
        return tensor


def configure_moe(module: nn.Module, hcg, accumulate_steps: int) -> bool:
    """Set what the MoE blocks of ``module`` need from fleet; False when it has none.

    * the load reducer (:class:`DataRankSum`), so the "global_batch" aux loss and the aux-loss-free
      bias see the loads of the whole global batch, identical on every rank;
    * the aux-loss scale ``1 / accumulate_steps``: each micro-batch's balancing loss reaches the
      gradients on its own, and fleet's gradients are the mean over the data ranks already, so
      the micro-batches' losses are averaged as the main loss is.
    """
    from sampan.nn.moe import moe_blocks, set_aux_loss_scale, set_load_reducer

    if not moe_blocks(module):
        return False
    groups = [hcg.mesh.get_group(axis) for axis in ("dp", "sharding", "cp") if hcg.degrees[axis] > 1]
    set_load_reducer(module, DataRankSum(groups) if groups else None)
    set_aux_loss_scale(module, 1.0 / accumulate_steps)
    return True

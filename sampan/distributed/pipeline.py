"""Pipeline parallelism on ``torch.distributed.pipelining``: stages cut from the layer list.

Each pp rank builds only its stages (``StageModule``s holding the model's own submodules), and a
schedule (GPipe, 1F1B, Interleaved1F1B) runs the micro-batches through them. The last stage
computes the loss; the embedding table and a tied output head sit on different stages, so each
keeps a copy and their gradients are summed across the two stages before every update (as
Megatron does).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining._backward import stage_backward
from torch.distributed.tensor import DTensor

from sampan.distributed.tensor_parallel import loss_context
from sampan.models.pipeline_parts import PipelineParts
from sampan.nn.moe import moe_blocks


class StageModule(nn.Module):
    """One pipeline stage: optional embeddings, a run of blocks, optional final norm and head.

    Attribute names mirror the model's (``embeddings``, ``layers``, ``lm_head``) so the same
    tensor-parallel plan patterns apply to a stage. ``head_input`` (last stage only) is an
    identity the head reads through: a place for a sequence-parallel plan to gather the sequence
    shards back into whole sequences before the head, which no module of the model offers there.
    """

    def __init__(self, parts: PipelineParts, first: int, last: int, is_first: bool, is_last: bool):
        super().__init__()
        self.embeddings = parts.embeddings if is_first else None
        self.layers = nn.ModuleList(parts.layers[first:last])
        self.norm = parts.norm if is_last else None
        self.head_input = nn.Identity() if is_last else None
        self.lm_head = parts.lm_head if is_last else None
        self.block_args = parts.block_args
        self.position_input = parts.positions
        # Not a submodule: a rotary embedding holds no tensors, and the model's name for it must
        # not appear among the stage's modules.
        self._rotary = [parts.rotary] if parts.rotary is not None else []
        self.positions: torch.Tensor | None = None
        """The token positions this rank's sequences hold, when they are not ``0 .. s-1`` (context
        parallel); set by the runner before each step."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = self.positions
        if self.embeddings is not None:
            if positions is not None and self.position_input == "embeddings":
                x = self.embeddings(x, position_ids=positions[None].expand(x.shape[0], -1))
            else:
                x = self.embeddings(x)
        extra = {}
        if positions is not None and self._rotary:
            extra["position_embeddings"] = self._rotary[0](positions[None], x.dtype)
        for layer in self.layers:
            x = layer(x, *self.block_args, **extra)
        if self.norm is not None:
            x = self.norm(x)
        if self.lm_head is not None:
            x = self.lm_head(self.head_input(x))
        return x


def layer_ranges(num_layers: int, num_chunks: int) -> list[tuple[int, int]]:
    """Split ``num_layers`` into ``num_chunks`` contiguous runs, earlier runs one longer if uneven."""
    base, extra = divmod(num_layers, num_chunks)
    ranges, start = [], 0
    for i in range(num_chunks):
        end = start + base + (1 if i < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges


def stage_indices(pp_rank: int, pp_size: int, virtual: int) -> list[int]:
    """The stages a pp rank runs: one, or ``virtual`` interleaved ones (rank, rank + pp, ...)."""
    return [pp_rank + k * pp_size for k in range(virtual)]


def build_stage_modules(parts: PipelineParts, pp_rank: int, pp_size: int, virtual: int) -> list[tuple[int, StageModule]]:
    num_stages = pp_size * virtual
    if len(parts.layers) < num_stages:
        raise ValueError(f"{len(parts.layers)} layers cannot fill {num_stages} pipeline stages")
    ranges = layer_ranges(len(parts.layers), num_stages)
    return [(i, StageModule(parts, *ranges[i], is_first=i == 0, is_last=i == num_stages - 1))
            for i in stage_indices(pp_rank, pp_size, virtual)]


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, kind: str) -> torch.Tensor:
    """Summed cross-entropy of the head's logits (shifted for a causal LM), -100 ignored."""
    if kind == "causal_lm":
        logits, labels = logits[:, :-1], labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=-100, reduction="sum")


class Stage(PipelineStage):
    """torch's ``PipelineStage``, with two memory leaks of a step closed.

    * **Sent input gradients.** A stage's received activations are leaf tensors, so backward
      accumulates their gradient into the receive buffer's ``.grad``; that gradient is what the
      stage sends back, and torch clears it only when the next step starts, so every non-first
      stage holds one activation-sized gradient per micro-batch of the step (19 GB on GPT-3 175B's
      last stage at t8 x p16 and 192 micro-batches, found by ``sampan simulate``). Here the
      reference is dropped as soon as the send is posted; the send op keeps the tensor alive until
      it completes.
    * **ZeRO-3 across micro-batches** (``zero3=True``). torch runs every micro-batch's backward with
      FSDP's gradient sync off and the parameters left gathered, and reduces once after the last:
      right for ZeRO-1/2, but under ZeRO-3 it holds every block's unsharded parameters and
      gradients for the rest of the step, which is the memory stage 3 exists to save. Here each
      micro-batch's backward reduce-scatters its gradients (FSDP2 adds them to the sharded ones)
      and reshards the parameters, as ``DistributedModel`` does without a pipeline; torch's final
      reduction then finds nothing left. Only full backwards occur (sampan's schedules are GPipe,
      1F1B and Interleaved1F1B).
    """

    def __init__(self, *args, zero3: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.zero3 = zero3

    def _forward_metadata_inference(self, *args, **kwargs):
        # torch learns what a stage sends by running its forward once, on the first step; that
        # forward trained on nothing, so the expert loads of MoE blocks (the aux-loss-free bias
        # update reads them) must not count it.
        loads = [(block, block.tokens_per_expert.clone()) for _, block in moe_blocks(self.submod)]
        try:
            return super()._forward_metadata_inference(*args, **kwargs)
        finally:
            for block, load in loads:
                block.tokens_per_expert.copy_(load)

    def get_bwd_send_ops(self, bwd_chunk_id: int):
        ops = super().get_bwd_send_ops(bwd_chunk_id)
        for info in self.args_recv_info.get(bwd_chunk_id, ()):
            buffer = getattr(info, "buffer", None)
            if isinstance(buffer, torch.Tensor):
                buffer.grad = None
        return ops

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False):
        if not self.zero3 or backward_type != "full" or not isinstance(self.submod, FSDPModule):
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)
        self.submod.set_is_last_backward(True)  # wait for this micro-batch's reduce-scatter before the next
        self.submod.set_reshard_after_backward(True)
        self.submod.set_requires_gradient_sync(True)
        grads = stage_backward(bwd_kwargs["stage_output"], bwd_kwargs["output_grads"], bwd_kwargs["input_values"])
        return grads, None


SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B, "Interleaved1F1B": ScheduleInterleaved1F1B}


class PipelineRunner:
    """Holds this rank's stages and schedule; ``run`` does one forward/backward over all micro-batches.

    ``zero3``: the stages are sharded at ZeRO stage 3, so gradients are reduced per micro-batch
    (:class:`Stage`). ``loss_parallel``: the head's logits are split by vocabulary (a DTensor),
    so the schedule runs under ``loss_parallel()`` (forward and backward).
    """

    def __init__(self, stages: list[tuple[int, StageModule]], num_stages: int, pp_group, schedule_mode: str,
                 n_microbatches: int, loss_kind: str, device: torch.device, zero3: bool = False,
                 loss_parallel: bool = False):
        self.modules = [module for _, module in stages]
        self.num_stages = num_stages
        self.pp_group = pp_group
        self.loss_kind = loss_kind
        self.has_first = any(i == 0 for i, _ in stages)
        self.has_last = any(i == num_stages - 1 for i, _ in stages)
        self._scale = 1.0
        self._loss_kind = loss_kind
        self.loss_parallel = loss_parallel
        self.stages = [Stage(module, i, num_stages, device, group=pp_group, zero3=zero3) for i, module in stages]
        cls = SCHEDULES[schedule_mode]
        stage_arg = self.stages if cls is ScheduleInterleaved1F1B else self.stages[0]
        # The loss is scaled by hand (token weighting), so the schedule must not divide gradients.
        self.schedule = cls(stage_arg, n_microbatches=n_microbatches, loss_fn=self._loss, scale_grads=False)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(logits, labels, self._loss_kind) * self._scale

    def run(self, input_ids: torch.Tensor, labels: torch.Tensor, scale: float, train: bool = True,
            positions: torch.Tensor | None = None, loss_kind: str | None = None) -> torch.Tensor:
        """Run the schedule; returns the sum of the micro-batch losses on the last stage (0 elsewhere).

        ``positions``: the token positions of ``input_ids``' columns when they are not ``0 .. s-1``
        (context parallel); ``loss_kind`` overrides the parts' loss ("token" for labels already
        shifted to the next token).
        """
        self._scale = scale
        self._loss_kind = loss_kind or self.loss_kind
        for module in self.modules:
            module.positions = positions
        losses: list[torch.Tensor] = []
        args = (input_ids,) if self.has_first else ()
        kwargs = {"target": labels, "losses": losses} if self.has_last else {}
        with loss_context(self.loss_parallel):
            if train:
                # return_outputs=False: nothing reads the merged outputs, and keeping them holds every
                # micro-batch's logits on the last stage until the step ends (40 GB a rank for GPT-3
                # 175B at t8 x p16, measured by `sampan simulate`; docs/scale.md).
                self.schedule.step(*args, return_outputs=False, **kwargs)
            else:
                self.schedule.eval(*args, **kwargs)
        total = torch.zeros((), dtype=torch.float64)
        for loss in losses:
            loss = loss.detach()
            total = total + (loss.full_tensor() if isinstance(loss, DTensor) else loss).to(torch.float64)
        return total


class TiedWeightSync:
    """Sums the gradients of a weight held by two stages (embedding table and tied head)."""

    def __init__(self, mesh, params: list[nn.Parameter]):
        # One group per pipeline: its first and last stage ranks. Every rank must create every
        # group (torch.distributed requires it), then keeps its own.
        ranks = mesh.mesh  # [pp, dp, sharding, mp] global ranks
        first, last = ranks[0].flatten().tolist(), ranks[-1].flatten().tolist()
        me = dist.get_rank()
        self.group = None
        for a, b in zip(first, last, strict=True):
            group = dist.new_group([a, b])
            if me in (a, b):
                self.group = group
        self.params = params

    def sync(self) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            grad = p.grad
            if isinstance(grad, DTensor):
                # The embedding's gradient may come back replicated or partial while the head's is
                # sharded like its weight: bring both to the weight's layout so the shards line up.
                if grad.placements != p.placements:
                    grad = grad.redistribute(grad.device_mesh, p.placements)
                    p.grad = grad
                grad = grad.to_local()
            dist.all_reduce(grad, group=self.group)


class StageNames:
    """Translates a rank's stage state-dict keys (``"0.layers.1.mlp.fc1.weight"`` in the
    ``ModuleList`` of its stages) back to the unsplit model's (``"gpt.layers.5.mlp.fc1.weight"``).

    Checkpoints are keyed by the model's names so they load at any layout. Two maps, because a
    weight tied between the embedding and the head lives on two pipeline ranks: model-state keys
    follow the module's *position* (``lm_head.weight`` on the last stage, as in the model's own
    state dict, which lists both names), while optimizer-state keys follow the *parameter*'s
    canonical name (the first, as ``get_state_dict`` uses for one process).
    """

    def __init__(self, modules: dict[str, str], canonical: dict[str, str]):
        self.modules = modules      # stage module path ("0.layers.1") -> model module path
        self.canonical = canonical  # stage parameter key -> the model's canonical parameter name

    @classmethod
    def of(cls, model: nn.Module, stages: list[nn.Module]) -> StageNames:
        module_names = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
        first_name = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            first_name.setdefault(id(p), name)
        modules, canonical = {}, {}
        for k, stage in enumerate(stages):
            for path, sub in stage.named_modules():
                if id(sub) in module_names:  # skips the stage's own containers (its ``layers`` list)
                    modules[f"{k}.{path}"] = module_names[id(sub)]
            for name, p in stage.named_parameters(remove_duplicate=False):
                canonical[f"{k}.{name}"] = first_name[id(p)]
        return cls(modules, canonical)

    def model_key(self, key: str) -> str:
        path, leaf = key.rsplit(".", 1)
        return f"{self.modules[path]}.{leaf}"

    def param_key(self, key: str) -> str:
        return self.canonical[key]

"""``DistributedModel``: a model placed on the hybrid topology, with ``train_batch`` / ``eval_batch``."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from sampan.distributed.context_parallel import ContextShard
from sampan.distributed.pipeline import token_loss_sum
from sampan.distributed.strategy import DistributedStrategy
from sampan.distributed.tensor_parallel import loss_context
from sampan.distributed.topology import HybridCommunicateGroup
from sampan.nn.moe import moe_blocks, update_expert_bias
from sampan.utils.loss_weights import loss_token_count


def split_micro_batches(batch: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """Cut every tensor of ``batch`` into ``count`` equal micro-batches along dim 0."""
    sizes = {k: v.shape[0] for k, v in batch.items() if isinstance(v, torch.Tensor)}
    size = next(iter(sizes.values()))
    if any(s != size for s in sizes.values()):
        raise ValueError(f"batch tensors disagree on the batch size: {sizes}")
    if size % count:
        raise ValueError(f"local batch of {size} does not split into {count} micro-batches "
                         "(pipeline_configs accumulate_steps); make the batch a multiple of it")
    step = size // count
    return [{k: (v[i * step:(i + 1) * step] if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
            for i in range(count)]


class DistributedModel(nn.Module):
    """The wrapped model ``fleet.distributed_model`` returns.

    ``forward`` is the model's own. ``train_batch`` runs one whole optimizer step over this rank's
    local batch and returns the global mean loss, the same on every rank.

    With context parallel (``cp_degree > 1``) every rank of a ``cp`` group gets the same batch and
    keeps its own part of each sequence (:class:`ContextShard`); ``loss_kind`` ("causal_lm" or
    "token", from the model's pipeline parts) says how its labels become per-position targets.
    """

    def __init__(self, model: nn.Module, hcg: HybridCommunicateGroup, strategy: DistributedStrategy,
                 loss_parallel: bool, pipeline=None, tied_sync=None, stage_names=None, loss_kind: str | None = None):
        super().__init__()
        self.hcg = hcg
        self.strategy = strategy
        self._loss_parallel = loss_parallel
        self._pipeline = pipeline
        self._tied_sync = tied_sync
        cp = hcg.degrees["cp"]
        self._context = (ContextShard(hcg.get_context_parallel_group(), cp, hcg.get_context_parallel_rank())
                         if cp > 1 else None)
        self._loss_kind = loss_kind
        # The model's own token counter (a staticmethod, so no reference to the unsplit model is
        # kept): ``sampan.utils.loss_token_count(wrapped, batch)`` counts as for the model.
        self.loss_token_count = getattr(model, "loss_token_count", None)
        self._moe = bool(moe_blocks(model))  # whose aux-loss-free bias train_batch moves
        if pipeline is None:
            self.model = model
        else:
            # Only this rank's stages are registered; the rest of the model is not held here.
            self.stages = nn.ModuleList(pipeline.modules)
            # Checkpoints translate the stages' names back to the model's (see StageNames).
            self.stage_names = stage_names

    def forward(self, *args, **kwargs):
        if self._pipeline is not None:
            raise RuntimeError("a pipeline-parallel model runs through train_batch / eval_batch, not forward")
        return self.model(*args, **kwargs)

    def _attention(self, seq_len: int):
        """What attention runs under: the context-parallel gather, or nothing."""
        return self._context.attention(seq_len) if self._context is not None else contextlib.nullcontext()

    def _pipeline_step(self, batch: dict[str, Any], train: bool) -> torch.Tensor:
        unknown = sorted(set(batch) - {"input_ids", "labels"})
        if unknown:
            raise ValueError(f"pipeline-parallel batches hold input_ids and labels only; got also {unknown}")
        seq_len = batch["input_ids"].shape[1]
        positions, kind = None, None
        if self._context is not None:
            batch = self._context.shard(batch, self._pipeline.loss_kind)
            positions, kind = batch["position_ids"][0], "token"
        labels = batch["labels"]
        if self.loss_token_count is not None and self._context is None:
            local = self.loss_token_count(labels)
        else:  # a model of the user's, or targets already shifted: count what the last stage's loss sums
            local = (labels[:, 1:] if (kind or self._pipeline.loss_kind) == "causal_lm" else labels).ne(-100).sum()
        global_count = self._sum_over_grad_ranks(torch.as_tensor(local, dtype=torch.float64))
        if not global_count > 0:
            raise ValueError("the global batch has no labelled tokens (all labels are -100): nothing to learn from")
        for module in self._pipeline.modules:
            module.train(train)
        scale = self.hcg.grad_world_size / float(global_count)
        with self._attention(seq_len):
            total = self._pipeline.run(batch["input_ids"], labels, scale, train=train, positions=positions,
                                       loss_kind=kind)
        # Only the last stage computed the loss: share it with every pp rank, then every data rank.
        loss = total / self.hcg.grad_world_size
        if self.hcg.degrees["pp"] > 1:
            dist.all_reduce(loss, group=self.hcg.get_pipe_parallel_group())
        return self._sum_over_grad_ranks(loss).to(torch.float32)

    def _context_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """The summed per-position loss of this rank's part of ``batch`` (already :class:`ContextShard`-ed)."""
        logits = self.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"])
        return token_loss_sum(logits, batch["labels"], "token")

    def _count(self, batch: dict[str, Any]) -> float:
        if self._context is not None:  # per-position targets
            return float(batch["labels"].ne(-100).sum())
        return loss_token_count(self.model, batch)

    def forward_backward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Forward and backward over ``accumulate_steps`` micro-batches, leaving complete gradients.

        ``batch`` is this rank's share of the global batch (``fleet.shard_batch`` cuts it); mp and cp
        ranks of one data shard pass the same batch. Returns the global mean loss on every rank, so
        every rank takes the same decision on it (e.g. skipping a non-finite step).
        """
        if self._pipeline is not None:
            loss = self._pipeline_step(batch, train=True)
            if self._tied_sync is not None:
                self._tied_sync.sync()
            return loss
        micro = split_micro_batches(batch, self.strategy.pipeline_configs.accumulate_steps)
        seq_len = micro[0]["input_ids"].shape[1] if "input_ids" in micro[0] else 0
        if self._context is not None:
            micro = [self._context.shard(mb, self._loss_kind) for mb in micro]
        # Each part's loss is weighted by how many tokens it averages, against the token count of
        # the whole global batch, so the step equals one process on the global batch even when the
        # parts hold different numbers of labelled tokens (MLM masks, padding, sequence chunks).
        # Gradient reduction averages over the data (and context-parallel) ranks, hence the factor
        # grad_world_size.
        counts = [self._count(mb) for mb in micro]
        global_count = self._sum_over_grad_ranks(torch.tensor(sum(counts), dtype=torch.float64))
        if not global_count > 0:
            raise ValueError("the global batch has no labelled tokens (all labels are -100): nothing to learn from")
        self.model.train()
        total = torch.zeros((), dtype=torch.float64)
        # Reduce gradients over the data ranks once per step, after the last micro-batch, not after
        # each (the pipeline schedules do the same for their stages). ZeRO-3 keeps reducing each
        # micro-batch: holding unsharded gradients between them would undo what stage 3 saves.
        delay_sync = (len(micro) > 1 and hasattr(self.model, "set_requires_gradient_sync")
                      and self.strategy.sharding_configs.stage != 3)
        with loss_context(self._loss_parallel), self._attention(seq_len):
            for i, (mb, count) in enumerate(zip(micro, counts, strict=True)):
                if delay_sync:
                    last = i == len(micro) - 1
                    self.model.set_requires_gradient_sync(last)
                    self.model.set_reshard_after_backward(last)  # and no re-gather per micro-batch
                if self._context is not None:  # a sum, so a part with no labelled token adds 0
                    part = self._context_loss(mb) / float(global_count)
                else:
                    part = self.model(**mb) * (float(count) / float(global_count))
                (part * self.hcg.grad_world_size).backward()
                part = part.detach()
                total = total + (part.full_tensor() if isinstance(part, DTensor) else part).to(torch.float64)
        return self._sum_over_grad_ranks(total).to(torch.float32)

    def train_batch(self, batch: dict[str, Any], optimizer, lr_scheduler=None) -> torch.Tensor:
        """One whole optimizer step: ``forward_backward``, then clip (the optimizer's ``grad_clip``),
        step and clear gradients. Returns the global mean loss on every rank."""
        loss = self.forward_backward(batch)
        optimizer.step()
        optimizer.clear_grad(set_to_zero=False)
        if self._moe:
            # Aux-loss-free balancing: the loads summed over the data ranks (the blocks' load
            # reducer), so the bias moves alike on every rank.
            update_expert_bias(self.model if self._pipeline is None else self.stages)
        if lr_scheduler is not None:
            lr_scheduler.step()
        return loss

    def _sum_over_grad_ranks(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the data ranks and the context-parallel ranks."""
        value = value.detach().reshape(()).clone()
        for axis in ("dp", "sharding", "cp"):
            if self.hcg.degrees[axis] > 1:
                dist.all_reduce(value, group=self.hcg.mesh.get_group(axis))
        return value

    @torch.no_grad()
    def eval_batch(self, batch: dict[str, Any]) -> torch.Tensor:
        """The global mean loss of ``batch`` (this rank's share), without updating anything.

        Weighted by each rank's labelled-token count, so it equals one process on the global batch.
        """
        if self._pipeline is not None:
            return self._pipeline_step(batch, train=False)
        was_training = self.model.training
        self.model.eval()
        seq_len = batch["input_ids"].shape[1] if "input_ids" in batch else 0
        if self._context is not None:
            batch = self._context.shard(batch, self._loss_kind)
        try:
            with loss_context(self._loss_parallel), self._attention(seq_len):
                if self._context is not None:
                    summed = self._context_loss(batch)
                else:
                    loss = self.model(**batch)
        finally:
            self.model.train(was_training)
        count = torch.as_tensor(self._count(batch), dtype=torch.float64)
        if self._context is None:
            if isinstance(loss, DTensor):  # a loss from vocabulary-parallel logits is a replicated DTensor
                loss = loss.full_tensor()
            summed = loss.detach().to(torch.float64) * count
        elif isinstance(summed, DTensor):
            summed = summed.full_tensor()
        weighted = self._sum_over_grad_ranks(summed.detach().to(torch.float64))
        return (weighted / self._sum_over_grad_ranks(count)).to(torch.float32)

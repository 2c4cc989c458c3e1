"""``DistributedModel``: a model placed on the hybrid topology, with ``train_batch`` / ``eval_batch``."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from sampan.distributed.strategy import DistributedStrategy
from sampan.distributed.tensor_parallel import loss_context
from sampan.distributed.topology import HybridCommunicateGroup
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
    """

    def __init__(self, model: nn.Module, hcg: HybridCommunicateGroup, strategy: DistributedStrategy,
                 loss_parallel: bool, pipeline=None, tied_sync=None, stage_names=None):
        super().__init__()
        self.hcg = hcg
        self.strategy = strategy
        self._loss_parallel = loss_parallel
        self._pipeline = pipeline
        self._tied_sync = tied_sync
        # The model's own token counter (a staticmethod, so no reference to the unsplit model is
        # kept): ``sampan.utils.loss_token_count(wrapped, batch)`` counts as for the model.
        self.loss_token_count = getattr(model, "loss_token_count", None)
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

    def _pipeline_step(self, batch: dict[str, Any], train: bool) -> torch.Tensor:
        unknown = sorted(set(batch) - {"input_ids", "labels"})
        if unknown:
            raise ValueError(f"pipeline-parallel batches hold input_ids and labels only; got also {unknown}")
        labels = batch["labels"]
        if self.loss_token_count is not None:
            local = self.loss_token_count(labels)
        else:  # a model of the user's: count what the last stage's loss averages
            local = (labels[:, 1:] if self._pipeline.loss_kind == "causal_lm" else labels).ne(-100).sum()
        global_count = self._sum_over_data_ranks(torch.as_tensor(local, dtype=torch.float64))
        if not global_count > 0:
            raise ValueError("the global batch has no labelled tokens (all labels are -100): nothing to learn from")
        for module in self._pipeline.modules:
            module.train(train)
        scale = self.hcg.data_world_size / float(global_count)
        total = self._pipeline.run(batch["input_ids"], labels, scale, train=train)
        # Only the last stage computed the loss: share it with every pp rank, then every data rank.
        loss = total / self.hcg.data_world_size
        if self.hcg.degrees["pp"] > 1:
            dist.all_reduce(loss, group=self.hcg.get_pipe_parallel_group())
        return self._sum_over_data_ranks(loss).to(torch.float32)

    def forward_backward(self, batch: dict[str, Any]) -> torch.Tensor:
        """Forward and backward over ``accumulate_steps`` micro-batches, leaving complete gradients.

        ``batch`` is this rank's share of the global batch (``fleet.shard_batch`` cuts it); mp ranks
        of one data shard pass the same batch. Returns the global mean loss on every rank, so every
        rank takes the same decision on it (e.g. skipping a non-finite step).
        """
        if self._pipeline is not None:
            loss = self._pipeline_step(batch, train=True)
            if self._tied_sync is not None:
                self._tied_sync.sync()
            return loss
        micro = split_micro_batches(batch, self.strategy.pipeline_configs.accumulate_steps)
        # Each part's mean loss is weighted by how many tokens it averages, against the token count
        # of the whole global batch, so the step equals one process on the global batch even when
        # the parts hold different numbers of labelled tokens (MLM masks, padding). Gradient
        # reduction averages over data ranks, hence the factor data_world_size.
        counts = [loss_token_count(self.model, mb) for mb in micro]
        global_count = self._sum_over_data_ranks(torch.tensor(sum(counts), dtype=torch.float64))
        if not global_count > 0:
            raise ValueError("the global batch has no labelled tokens (all labels are -100): nothing to learn from")
        self.model.train()
        total = torch.zeros((), dtype=torch.float64)
        # Reduce gradients over the data ranks once per step, after the last micro-batch, not after
        # each (the pipeline schedules do the same for their stages). ZeRO-3 keeps reducing each
        # micro-batch: holding unsharded gradients between them would undo what stage 3 saves.
        delay_sync = (len(micro) > 1 and hasattr(self.model, "set_requires_gradient_sync")
                      and self.strategy.sharding_configs.stage != 3)
        with loss_context(self._loss_parallel):
            for i, (mb, count) in enumerate(zip(micro, counts, strict=True)):
                if delay_sync:
                    last = i == len(micro) - 1
                    self.model.set_requires_gradient_sync(last)
                    self.model.set_reshard_after_backward(last)  # and no re-gather per micro-batch
                loss = self.model(**mb)
                weight = float(count) / float(global_count)
                (loss * (weight * self.hcg.data_world_size)).backward()
                loss = loss.detach()
                total = total + (loss.full_tensor() if isinstance(loss, DTensor) else loss).to(torch.float64) * weight
        return self._sum_over_data_ranks(total).to(torch.float32)

    def train_batch(self, batch: dict[str, Any], optimizer, lr_scheduler=None) -> torch.Tensor:
        """One whole optimizer step: ``forward_backward``, then clip (the optimizer's ``grad_clip``),
        step and clear gradients. Returns the global mean loss on every rank."""
        loss = self.forward_backward(batch)
        optimizer.step()
        optimizer.clear_grad(set_to_zero=False)
        if lr_scheduler is not None:
            lr_scheduler.step()
        return loss

    def _sum_over_data_ranks(self, value: torch.Tensor) -> torch.Tensor:
        value = value.detach().reshape(()).clone()
        for axis in ("dp", "sharding"):
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
        try:
            with loss_context(self._loss_parallel):
                loss = self.model(**batch)
        finally:
            self.model.train(was_training)
        if isinstance(loss, DTensor):  # a loss from vocabulary-parallel logits is a replicated DTensor
            loss = loss.full_tensor()
        count = torch.as_tensor(loss_token_count(self.model, batch), dtype=torch.float64)
        weighted = self._sum_over_data_ranks(loss.detach().to(torch.float64) * count)
        return (weighted / self._sum_over_data_ranks(count)).to(torch.float32)

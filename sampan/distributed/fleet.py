"""``fleet``: declare a hybrid-parallel strategy, then wrap a model and an optimizer with it.

    from sampan.distributed import fleet
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 2, "mp_degree": 2}
    fleet.init(is_collective=True, strategy=strategy)
    model = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(optimizer)
    loss = model.train_batch(fleet.shard_batch(batch), optimizer)

The state (strategy, topology) lives in a ``Fleet`` object; the module-level functions use a
default one, as Paddle users expect. Code that wants two setups can make its own ``Fleet``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import parallelize_module

from sampan.distributed import env
from sampan.distributed.clip import HybridClipGradByGlobalNorm
from sampan.distributed.model import DistributedModel
from sampan.distributed.pipeline import PipelineRunner, StageNames, TiedWeightSync, build_stage_modules
from sampan.distributed.sharding import apply_sharding
from sampan.distributed.strategy import DistributedStrategy
from sampan.distributed.tensor_parallel import apply_tensor_parallel, uses_loss_parallel
from sampan.distributed.topology import HybridCommunicateGroup
from sampan.models.pipeline_parts import PipelineParts
from sampan.models.registry import spec_of
from sampan.nn.clip import ClipGradByGlobalNorm
from sampan.nn.recompute import apply_recompute


class Fleet:
    """One hybrid-parallel setup: strategy, topology, and the parameter map of the wrapped model."""

    def __init__(self) -> None:
        self.strategy: DistributedStrategy | None = None
        self.hcg: HybridCommunicateGroup | None = None
        self._param_map: dict[int, torch.Tensor] | None = None

    def init(self, is_collective: bool = True, strategy: DistributedStrategy | None = None) -> Fleet:
        """Join the launcher's process group (or make a one-rank group) and build the topology."""
        if not is_collective:
            raise ValueError("only collective training (is_collective=True) is supported; "
                             "parameter-server mode is not part of sampan")
        env.init_process_group()
        self.strategy = strategy if strategy is not None else DistributedStrategy()
        degrees = self.strategy.resolve_degrees(dist.get_world_size())
        if self.strategy.tensor_parallel_configs.sequence_parallel and degrees["mp"] > 1 and degrees["pp"] > 1:
            raise ValueError("sequence_parallel with pp_degree > 1 is not implemented yet; use it with mp and dp")
        self.hcg = HybridCommunicateGroup(degrees, env.default_device_type())
        return self

    def _require_init(self) -> HybridCommunicateGroup:
        if self.hcg is None or self.strategy is None:
            raise RuntimeError("call fleet.init(is_collective=True, strategy=...) first")
        return self.hcg

    def get_hybrid_communicate_group(self) -> HybridCommunicateGroup:
        return self._require_init()

    def worker_index(self) -> int:
        return dist.get_rank() if dist.is_initialized() else env.rank()

    def worker_num(self) -> int:
        return dist.get_world_size() if dist.is_initialized() else env.world_size()

    def distributed_model(self, model: nn.Module, tp_plan: dict[str, str] | None = None,
                          pipeline_parts: PipelineParts | None = None) -> DistributedModel:
        """Split ``model`` as the strategy says: tensor parallel, recompute, then dp / sharding.

        sampan's model families (GPT, ERNIE, Llama / Qwen) declare their splits in their spec. A
        model sampan doesn't know brings its own: ``tp_plan`` (module-name pattern -> "colwise" |
        "rowwise" | "vocab" | "shared_input") for mp > 1, ``pipeline_parts`` (a
        ``PipelineParts``: embeddings, layers, norm, head, loss) for pp > 1.
        """
        hcg = self._require_init()
        strategy = self.strategy
        degrees = hcg.degrees
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "num_heads"):
            strategy.validate_for_model(config.num_heads, config.num_layers, config.vocab_size, degrees,
                                        num_kv_heads=getattr(config, "num_kv_heads", None))
        if degrees["pp"] > 1:
            return self._distributed_pipeline_model(model, tp_plan, pipeline_parts)
        old = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
        loss_parallel = False
        if degrees["mp"] > 1:
            plan = tp_plan if tp_plan is not None else _family_split(model, "tensor_parallel_plan")
            if plan is None:
                raise ValueError(f"mp_degree {degrees['mp']} needs a tensor-parallel plan for {type(model).__name__}: "
                                 "pass tp_plan={'module.name.pattern': 'colwise' | 'rowwise' | 'vocab'}")
            if strategy.tensor_parallel_configs.sequence_parallel:
                sp_plan = _family_split(model, "sequence_parallel_plan") if tp_plan is None else None
                if sp_plan is None:
                    raise ValueError("sequence_parallel needs a model family's sequence-parallel plan (sampan's GPT, "
                                     f"ERNIE and Llama / Qwen have one); {type(model).__name__} with a custom "
                                     "tp_plan has none")
                parallelize_module(model, hcg.mesh["mp"], sp_plan)
                if hasattr(model, "tie_weights"):
                    model.tie_weights()
            else:
                apply_tensor_parallel(model, hcg.mesh["mp"], plan)
            loss_parallel = uses_loss_parallel(model, plan)
        apply_recompute(model, strategy.recompute)
        if hcg.data_world_size > 1:
            apply_sharding(model, hcg.data_mesh(), strategy.sharding_configs.stage)
        new = dict(model.named_parameters(remove_duplicate=False))
        self._param_map = {pid: new[name] for pid, name in old.items() if name in new}
        return DistributedModel(model, hcg, strategy, loss_parallel)

    def _distributed_pipeline_model(self, model: nn.Module, tp_plan: dict[str, str] | None,
                                    parts: PipelineParts | None) -> DistributedModel:
        """pp > 1: keep only this rank's stages, then tensor parallel, recompute and sharding per stage."""
        hcg, strategy = self.hcg, self.strategy
        degrees = hcg.degrees
        parts = parts if parts is not None else _family_split(model, "pipeline_parts")
        if parts is None:
            raise ValueError(f"pp_degree {degrees['pp']} needs pipeline split points for {type(model).__name__}: pass "
                             "pipeline_parts=PipelineParts(embeddings, layers, norm, lm_head, loss) "
                             "(sampan's language models have theirs: GPT and Llama / Qwen causal LMs, ERNIE's MLM)")
        tied = {id(p) for p in parts.embeddings.parameters()} & {id(p) for p in parts.lm_head.parameters()}
        pipe = strategy.pipeline_configs
        virtual = pipe.virtual_pp_degree
        stages = build_stage_modules(parts, hcg.get_stage_id(), degrees["pp"], virtual)
        names = StageNames.of(model, [m for _, m in stages])
        old = {id(p): (k, name) for k, (_, m) in enumerate(stages) for name, p in m.named_parameters()}
        plan = tp_plan if tp_plan is not None else _family_split(model, "tensor_parallel_plan")
        model_names = {id(m): name for name, m in model.named_modules(remove_duplicate=False)}
        for _, module in stages:
            if degrees["mp"] > 1:
                if plan is None:
                    raise ValueError(f"mp_degree {degrees['mp']} needs a tensor-parallel plan for "
                                     f"{type(model).__name__}")
                # The plan's patterns are written against the model's names; a stage holds the
                # same modules under its own (``embeddings``, ``layers.0``), so match by the model's.
                as_model = {name: model_names.get(id(m), name) for name, m in module.named_modules()}
                apply_tensor_parallel(module, hcg.mesh["mp"], plan, require_match=False, sharded_logits=False,
                                      match_names=as_model)
            apply_recompute(module, strategy.recompute)
            if hcg.data_world_size > 1:
                apply_sharding(module, hcg.data_mesh(), strategy.sharding_configs.stage)
        news = [dict(m.named_parameters()) for _, m in stages]
        self._param_map = {pid: news[k][name] for pid, (k, name) in old.items()}
        tied_params = [self._param_map[pid] for pid in tied if pid in self._param_map]
        num_stages = degrees["pp"] * virtual
        for (index, _module), new in zip(stages, news, strict=True):
            if index == num_stages - 1:
                for pid in tied:
                    if pid in self._param_map and any(q is self._param_map[pid] for q in new.values()):
                        self._param_map[pid]._sampan_pipeline_duplicate = True
        device = torch.device(env.default_device_type())
        runner = PipelineRunner(stages, num_stages, hcg.get_pipe_parallel_group(), pipe.schedule_mode,
                                pipe.accumulate_steps, parts.loss, device)
        sync = TiedWeightSync(hcg.mesh, tied_params) if tied else None
        return DistributedModel(model, hcg, strategy, loss_parallel=False, pipeline=runner, tied_sync=sync,
                                stage_names=names)

    def distributed_optimizer(self, optimizer, strategy: DistributedStrategy | None = None):
        """Point ``optimizer`` at the distributed parameters and make its clipping global across ranks."""
        hcg = self._require_init()
        if strategy is not None and strategy is not self.strategy:
            raise ValueError("distributed_optimizer got a strategy different from fleet.init's; pass the same one")
        if self._param_map is None:
            raise RuntimeError("call fleet.distributed_model(model) before fleet.distributed_optimizer(optimizer)")
        param_map = self._param_map
        if hcg.degrees["pp"] > 1:
            # Other stages' parameters are not this rank's to update (or to hold state for).
            optimizer.rebind_parameters(lambda p: param_map.get(id(p)))
        else:
            optimizer.rebind_parameters(lambda p: param_map.get(id(p), p))
        if isinstance(optimizer.grad_clip, ClipGradByGlobalNorm):
            pp_group = hcg.get_pipe_parallel_group() if hcg.degrees["pp"] > 1 else None
            optimizer.grad_clip = HybridClipGradByGlobalNorm(optimizer.grad_clip.clip_norm, pp_group)
        return optimizer

    def shard_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """This rank's slice of a global batch: one of ``dp x sharding`` equal parts along dim 0."""
        hcg = self._require_init()
        n, r = hcg.data_world_size, hcg.data_rank
        out = {}
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                if value.shape[0] % n:
                    raise ValueError(f"global batch of {value.shape[0]} ({key}) does not split over {n} data-parallel "
                                     "ranks; make it a multiple of dp_degree x sharding_degree")
                size = value.shape[0] // n
                value = value[r * size:(r + 1) * size]
            out[key] = value
        return out


def _family_split(model: nn.Module, name: str):
    """The model family's ``tensor_parallel_plan`` / ``sequence_parallel_plan`` / ``pipeline_parts``
    of ``model``, or None when sampan doesn't know the model."""
    spec = spec_of(model)
    return getattr(spec.parallel(), name)(model) if spec is not None else None


_default = Fleet()
init = _default.init
distributed_model = _default.distributed_model
distributed_optimizer = _default.distributed_optimizer
get_hybrid_communicate_group = _default.get_hybrid_communicate_group
worker_index = _default.worker_index
worker_num = _default.worker_num
shard_batch = _default.shard_batch

__all__ = ["DistributedStrategy", "Fleet", "PipelineParts", "distributed_model", "distributed_optimizer",
           "get_hybrid_communicate_group", "init", "shard_batch", "worker_index", "worker_num"]

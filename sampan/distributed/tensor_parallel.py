"""Apply a tensor-parallel plan (name pattern -> "colwise" | "rowwise" | "vocab" | "shared_input" |
"head_norm") with DTensor.

"shared_input" marks a module whose first input feeds several column-parallel layers (attention's
q, k and v projections): the input becomes one replicated DTensor before they read it, so their
input gradients are summed as partial sums and all-reduced once, as Megatron's fused QKV does,
instead of once per projection (3 all-reduces per layer in backward become 1).

"head_norm" marks a norm applied to each head of a head-sharded activation (Qwen3's q / k norm on
``[b, s, heads, d]``): every rank sees only its own heads, so its weight gradient is a partial sum.
The weight becomes a replicated DTensor and the input a head-sharded one, and DTensor sums the
gradient over the mp ranks; left a plain tensor, each rank would step with its own part.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from fnmatch import fnmatchcase

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from sampan.nn.vocab_parallel import VocabParallelEmbedding

STYLES = ("colwise", "rowwise", "vocab", "shared_input", "head_norm")
HEAD_DIM = 2  # [batch, seq, heads, head_dim]


def _style(kind: str, module: nn.Module, name: str):
    if kind == "colwise":
        return ColwiseParallel()
    if kind == "rowwise":
        return RowwiseParallel()
    if kind == "head_norm":
        return SequenceParallel(sequence_dim=HEAD_DIM, use_local_output=True)
    if isinstance(module, nn.Embedding):
        # Each rank holds a slice of the vocabulary; out-of-slice ids give zeros, and the partial
        # embeddings are summed (all-reduce) into a replicated output.
        return VocabParallelEmbedding(Replicate())
    if isinstance(module, nn.Linear):
        # Logits stay sharded over the vocabulary (a DTensor) for the parallel cross-entropy.
        return ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    raise ValueError(f"style 'vocab' needs an nn.Embedding or nn.Linear, but {name} is a {type(module).__name__}")


def resolve_plan(model: nn.Module, plan: dict[str, str], require_match: bool = True,
                 match_names: Mapping[str, str] | None = None) -> dict[str, object]:
    """Match ``plan``'s patterns against ``model``'s module names.

    Every pattern must match something unless ``require_match`` is False (a pipeline stage holds
    only part of the model). ``match_names`` maps a module's name in ``model`` to the name the
    patterns are matched against (a stage's modules under the whole model's names).
    """
    resolved: dict[str, object] = {}
    for name, kind, module in _matches(model, plan, require_match, match_names):
        if kind != "shared_input":
            resolved[name] = _style(kind, module, name)
    return resolved


def _matches(model: nn.Module, plan: dict[str, str], require_match: bool,
             match_names: Mapping[str, str] | None = None):
    """``(module name, style, module)`` for every module a plan pattern matches."""
    modules = dict(model.named_modules())
    names = match_names or {}
    for pattern, kind in plan.items():
        if kind not in STYLES:
            raise ValueError(f"tensor-parallel plan entry {pattern!r}: unknown style {kind!r}; allowed: {list(STYLES)}")
        matches = [name for name in modules if name and fnmatchcase(names.get(name, name), pattern)]
        if not matches and require_match:
            raise ValueError(f"tensor-parallel plan pattern {pattern!r} matches no module of {type(model).__name__}")
        for name in matches:
            yield name, kind, modules[name]


def _share_first_input(module: nn.Module, mesh: DeviceMesh) -> None:
    def hook(_module, args):
        if not args or isinstance(args[0], DTensor):
            return None
        return (DTensor.from_local(args[0], mesh, [Replicate()], run_check=False), *args[1:])

    module.register_forward_pre_hook(hook)


def uses_loss_parallel(model: nn.Module, plan: dict[str, str]) -> bool:
    """Whether an output layer is vocabulary-parallel (then the loss must run under ``loss_parallel``)."""
    modules = dict(model.named_modules())
    return any(kind == "vocab" and isinstance(modules[name], nn.Linear)
               for pattern, kind in plan.items() for name in modules if name and fnmatchcase(name, pattern))


def apply_tensor_parallel(model: nn.Module, mesh: DeviceMesh, plan: dict[str, str], require_match: bool = True,
                          match_names: Mapping[str, str] | None = None) -> nn.Module:
    """Shard ``model`` in place over the 1-D ``mesh`` as ``plan`` says; tied weights are re-tied."""
    if hasattr(model, "config"):
        for field in ("num_heads", "num_kv_heads"):
            heads = getattr(model.config, field, None)
            if heads is not None and heads % mesh.size():
                raise ValueError(f"mp_degree {mesh.size()} does not divide the model's {heads} {field} "
                                 "(each tensor-parallel rank holds whole heads)")
    parallelize_module(model, mesh, resolve_plan(model, plan, require_match, match_names))
    for _, kind, module in _matches(model, plan, require_match, match_names):
        if kind == "shared_input":
            _share_first_input(module, mesh)
    # Sharding replaced each tied parameter twice (embedding and head); share the result again.
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


def stage_sequence_parallel_plan(model_plan: Mapping[str, object], stage_to_model: Mapping[str, str],
                                 is_last: bool) -> dict[str, object]:
    """A family's sequence-parallel plan, written for the whole model, restated for one pipeline stage.

    ``model_plan`` is keyed by the model's module names; ``stage_to_model`` maps each of the stage's
    module names to the model's name for the same module (modules the model does not hold, such as
    the stage's own containers, are left out). Entries for modules on other stages, and for the
    model's body (whose output gather has no place in a stage), drop out. Between stages the
    residual stream travels as this rank's sequence shard ``[b, s / mp, h]``, so what a pipeline
    sends and keeps per micro-batch shrinks by ``mp`` too.

    The last stage gathers the sequence before its head (``head_input``); the head's logits stay
    split by vocabulary, as the family's plan says, for the parallel cross-entropy.
    """
    to_stage = {model: stage for stage, model in stage_to_model.items()}
    plan: dict[str, object] = {}
    for name, style in model_plan.items():
        stage_name = to_stage.get(name)
        if stage_name:  # held by this stage, and not the stage itself
            plan[stage_name] = style
    if is_last:
        plan["head_input"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                use_local_output=True)
    return plan


def loss_context(enabled: bool):
    """``loss_parallel()`` when logits are vocabulary-sharded, else nothing."""
    return loss_parallel() if enabled else contextlib.nullcontext()

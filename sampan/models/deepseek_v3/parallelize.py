"""How the DeepSeek-V3 family splits: tensor-parallel plan, pipeline parts and expert-parallel modules.

Tensor parallel splits the dense layers' SwiGLU and the vocabulary as in Llama; attention and the
MoE blocks stay whole on every mp rank (expert parallelism shards the experts:
``expert_parallel_modules``).

Why MLA is not split by heads: every head reads the one rotary key ``k_rot`` that
``kv_a_proj_with_mqa`` computes from the replicated input. With the heads split (q_b_proj and
kv_b_proj column-wise, o_proj row-wise) the forward is exact, but each rank's gradient of
``k_rot`` sums only its own heads, so ``kv_a_proj_with_mqa`` and everything below it would step
on a partial gradient (an mp=2 fleet run diverged from one process after the first step). The
split needs an "identity forward, all-reduce backward" on ``k_rot`` (Megatron's
copy-to-tensor-parallel-region), which the plan's styles (colwise, rowwise, vocab, shared_input,
head_norm) cannot express yet.
"""

from __future__ import annotations

from torch import nn

from sampan.models.deepseek_v3.modeling import DeepseekV3ForCausalLM, DeepseekV3Model
from sampan.models.pipeline_parts import PipelineParts
from sampan.nn.moe import MoE


def _body(model: nn.Module) -> tuple[str, DeepseekV3Model]:
    if isinstance(model, DeepseekV3ForCausalLM):
        return "model", model.model
    if isinstance(model, DeepseekV3Model):
        return "", model
    raise ValueError(f"not a DeepSeek-V3 model: {type(model).__name__}")


def tensor_parallel_plan(model: nn.Module) -> dict[str, str]:
    """The dense layers' SwiGLU and the vocabulary across mp ranks; attention and MoE blocks
    replicated (see the module docstring). Patterns name each dense layer, so the MoE layers'
    shared experts, which have the same names, stay replicated."""
    body, inner = _body(model)
    prefix = f"{body}." if body else ""
    plan = {f"{prefix}embed_tokens": "vocab"}
    for i, layer in enumerate(inner.layers):
        if not isinstance(layer.mlp, MoE):
            name = f"{prefix}layers.{i}.mlp"
            plan[name] = "shared_input"
            plan[f"{name}.gate_proj"] = "colwise"
            plan[f"{name}.up_proj"] = "colwise"
            plan[f"{name}.down_proj"] = "rowwise"
    if body:
        plan["lm_head"] = "vocab"
    return plan


def sequence_parallel_plan(model: nn.Module) -> None:
    """None: sequence parallel is not declared for MLA yet (its replicated latent projections would
    need the sequence gathered before them and the MoE blocks would need their tokens gathered too)."""
    return None


def pipeline_parts(model: nn.Module) -> PipelineParts | None:
    """Embedding, decoder layers, final norm and LM head (None for the bare body, which has no loss).

    The MTP modules sit after the head and read the embedding again, which a pipeline stage does
    not hold: a model with them is refused rather than pipelined without its MTP loss.
    """
    if not isinstance(model, DeepseekV3ForCausalLM):
        return None
    if len(model.mtp):
        raise ValueError("a DeepSeek-V3 model with MTP modules (num_nextn_predict_layers > 0) cannot be pipelined yet; "
                         "set num_nextn_predict_layers=0 or use no pipeline parallelism")
    return PipelineParts(model.model.embed_tokens, model.model.layers, model.model.norm, model.lm_head,
                         loss="causal_lm", block_args=(None, True), positions="rotary", rotary=model.model.rotary)


def expert_parallel_modules(model: nn.Module) -> list[str]:
    """The module names of every MoE block's experts (``model.layers.3.mlp.experts``, ``mtp.0.mlp.experts``)."""
    return [f"{name}.experts" for name, module in model.named_modules() if isinstance(module, MoE)]

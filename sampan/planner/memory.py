"""Bytes per GPU of a layout, for the stage that needs the most.

Model state, as sampan holds it (``benchmarks/results/hybrid_parallel.json`` measures these per
rank): fp32 parameters (AMP is autocast over fp32 weights), fp32 gradients and AdamW's two fp32
moments, 4 + 4 + 8 = 16 bytes per parameter. FSDP2 keeps all three sharded over ``sharding`` ranks
at every ZeRO stage; what the stage changes is the working copies held during a step (buffers).

Activations per block and micro-batch follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), with its element counts, but with the byte sizes
sampan really stores: the residual stream (norm inputs) is fp32 under autocast, matmul
outputs are bf16, attention is ``scaled_dot_product_attention`` (flash: the output and a
log-sum-exp, no ``s x s`` matrix), and dropout masks are absent (dropout 0, as the GPT zoo sets).
For GPT / ERNIE blocks, in Korthikanti's 2-byte units with dropout, this is ``34 s b h``
(``10 + 24/t`` with tensor parallel ``t``, ``34/t`` with sequence parallel), without the
``5 a s^2 b`` that flash removes.

Llama-family blocks (``layer_activation_bytes`` lists the tensors) differ in three ways, each
counted from what sampan's eager model keeps (saved-tensor hooks on ``llama-tiny``, fp32 and CPU
bf16 autocast, ``tests/test_planner.py``): grouped-query attention keeps k and v ``KV d`` wide
instead of ``h`` (q and the attention output stay ``H d``); SwiGLU keeps four ``f``-wide tensors
(gate, its SiLU, up, and their product, the down projection's input) instead of two; and
sampan's fp32 ``RMSNorm`` keeps both its input and the normalised tensor before the weight, while
under autocast every projection that reads a norm's output casts its own bf16 copy (autocast
caches casts of weights, not of activations): 3 after the attention norm, 2 after the MLP norm.
"""

from __future__ import annotations

import dataclasses
import math

from sampan.planner.layout import Layout, Workload
from sampan.planner.model_shape import ModelShape

RESERVED_BYTES = 2.0e9
"""CUDA context, NCCL channels and allocator fragmentation: a fixed allowance per GPU (an assumption,
not measured here: there is no GPU on this machine)."""

PARAM_BYTES, GRAD_BYTES, OPTIM_BYTES = 4, 4, 8


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes on one GPU of the fullest pipeline stage."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    reserved: float = RESERVED_BYTES
    stage: int = 0
    """Which pipeline stage is the fullest (0 = first)."""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers + self.reserved

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total": self.total}


def stage_params(model: ModelShape, layout: Layout, stage: int) -> float:
    """Parameters on one tensor-parallel rank of pipeline ``stage``, before ZeRO sharding.

    Exact for sampan's plans (GPT / ERNIE ``block_plans``, Llama ``parallelize``): q / k / v and
    fc1 (gate / up) column-parallel, weights and biases split; out-proj / fc2 (down) row-parallel,
    weights split, biases replicated; norms (and Qwen3's q / k norms) and position embeddings
    replicated; the vocabulary split. With pp > 1 a tied head keeps its own copy on the last stage.
    """
    mp, pp = layout.mp, layout.pp
    vocab = model.padded_vocab(mp)
    layers = math.ceil(model.layers / pp)
    total = layers * model.layer_params_per_mp(mp)
    if stage == 0:
        total += vocab * model.hidden / mp + model.learned_positions * model.hidden
    if stage == pp - 1:
        total += model.norm_params + model.extra_params
        if not model.tied or pp > 1:
            total += vocab * model.hidden / mp
    return total


def layer_activation_bytes(model: ModelShape, layout: Layout, work: Workload, recompute: str) -> float:
    """Bytes one block keeps for backward, per micro-batch, on one tensor-parallel rank.

    GPT / ERNIE (LayerNorm, MLP of two matrices), with recompute none: both norms' inputs (fp32)
    and outputs (the matmuls' input), q k v and the attention output, the log-sum-exp, fc1's output
    and its activation. Validated against fp32 measurements; under autocast q / k / v each cast the
    norm's output to bf16 themselves, 2 copies of ``e s b h`` this formula leaves out (kept so the
    published-run validation in docs/planner.md stays the one it reports).

    Llama family (RMSNorm, GQA, SwiGLU), recompute none, all from sampan's eager model:

    * each RMSNorm: its fp32 input and the fp32 normalised tensor (``2 r s b h``, split by sequence
      parallel); its output as the projections read it: one tensor in fp32, one bf16 copy per
      projection under autocast (3 for q / k / v, 2 for gate / up), whole-sequence even with
      sequence parallel (the column-parallel matmuls save the gathered input);
    * attention: q and its output ``H d`` wide, k and v ``KV d`` wide (the tensors flash attention
      saves, after RoPE), the log-sum-exp over query heads; Qwen3's q / k norms add their fp32
      input and normalised output (``(r + e) (H + KV) d``);
    * SwiGLU: gate, SiLU(gate), up and their product, ``4 e s b f / t``.

    Selective keeps the block input and every matmul / attention output (sampan's op-level
    policy, as torchtitan's); full keeps only the block input.
    """
    s, b, h, f, a = work.seq_len, layout.micro_batch, model.hidden, model.ffn, model.heads
    t = layout.mp
    e = 2 if work.amp else 4           # matmul outputs / inputs of matmuls (bf16 under autocast)
    r = 4                              # residual stream: norm inputs stay fp32 under autocast
    ln = t if layout.sp else 1         # sequence parallel splits the norm regions too
    sbh = s * b * h
    if recompute == "full":            # only the block's input
        return r * sbh / ln
    lse = 4 * a * s * b / t            # flash attention's log-sum-exp (fp32)
    # q, k, v and the attention output: 4 e s b h for multi-head attention, less with GQA's k, v
    qkv_o = e * s * b * (2 * model.q_width + 2 * model.kv_width) / t
    mlp = 2 * model.mlp_in_matrices * e * s * b * f / t  # fc1 out + activation; or gate, SiLU, up, product
    if recompute == "selective":       # block input + every matmul / attention output (torchtitan-style)
        return r * sbh / ln + qkv_o + lse + model.mlp_in_matrices * e * s * b * f / t + 2 * e * sbh
    if model.norm == "layernorm":      # both norms' inputs (fp32) and outputs (the matmul inputs)
        norms = 2 * (r + e) * sbh / ln
    else:                              # RMSNorm: input + normalised (fp32), then the projections' copies
        copies = 3 + model.mlp_in_matrices if work.amp else 2
        norms = 2 * 2 * r * sbh / ln + copies * e * sbh
    qk_norm = (r + e) * s * b * (model.q_width + model.kv_width) / t if model.qk_norm else 0
    return norms + qkv_o + lse + mlp + qk_norm


def in_flight(layout: Layout, stage: int) -> float:
    """Micro-batches' worth of activations (for this stage's layers) held at the peak."""
    p, m, v = layout.pp, layout.num_micro, layout.vpp
    if p == 1:
        return 1.0
    if layout.schedule == "GPipe":
        return float(m)
    if v > 1:  # Megatron's interleaved warm-up: 2 (p - i - 1) + (v - 1) p + 1 chunks of L / (p v) layers
        chunks = min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1)
        return chunks / v
    return float(min(m, p - stage))


def head_activation_bytes(model: ModelShape, layout: Layout, work: Workload) -> float:
    """The last stage's final norm and fp32 logits (kept by the vocabulary-parallel cross-entropy)."""
    s, b, h = work.seq_len, layout.micro_batch, model.hidden
    e = 2 if work.amp else 4
    ln = layout.mp if layout.sp else 1
    logits = 4 * s * b * model.padded_vocab(layout.mp) / layout.mp
    if model.norm == "layernorm":
        return logits + (4 + e) * s * b * h / ln
    # RMSNorm: input and normalised in fp32, and the head's (whole-sequence) input
    return logits + 2 * 4 * s * b * h / ln + e * s * b * h


def memory(model: ModelShape, layout: Layout, work: Workload) -> Memory:
    """The fullest stage's :class:`Memory` (checks the first and the last stage)."""
    best = None
    for stage in sorted({0, layout.pp - 1}):
        mem = _stage_memory(model, layout, work, stage)
        if best is None or mem.total > best.total:
            best = mem
    return best


def _stage_memory(model: ModelShape, layout: Layout, work: Workload, stage: int) -> Memory:
    n = stage_params(model, layout, stage)
    shard = layout.sharding
    params, grads, optim = PARAM_BYTES * n / shard, GRAD_BYTES * n / shard, OPTIM_BYTES * n / shard
    layers = math.ceil(model.layers / layout.pp)
    per_layer = layer_activation_bytes(model, layout, work, layout.recompute)
    acts = in_flight(layout, stage) * layers * per_layer
    if layout.recompute != "none":  # backward rebuilds one block's full activations at a time
        acts += layer_activation_bytes(model, layout, work, "none") - per_layer
    if stage == layout.pp - 1:
        heads = layout.num_micro if (layout.schedule == "GPipe" and layout.pp > 1) else 1
        acts += heads * head_activation_bytes(model, layout, work)
    unit = model.layer_params_per_mp(layout.mp)  # one FSDP unit (a block), unsharded
    buffers = 0.0
    if work.amp:  # autocast's bf16 copies of the weights, saved by the matmuls for backward
        buffers += 2 * n
    if shard > 1:
        if layout.stage == 3:  # one block gathered, the next prefetched; one block's gradient before reduce-scatter
            buffers += (2 * PARAM_BYTES + GRAD_BYTES) * unit
        else:  # parameters stay gathered from forward to backward; gradients accumulate unsharded
            buffers += PARAM_BYTES * n + (GRAD_BYTES * n if layout.num_micro > 1 else GRAD_BYTES * unit)
    return Memory(params, grads, optim, acts, buffers, RESERVED_BYTES, stage)

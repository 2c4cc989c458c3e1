"""Bytes per GPU of a layout, for the stage that needs the most.

Everything here is counted from what sampan's code really allocates: the model state from real gloo
runs (``benchmarks/results/hybrid_parallel.json``), the activations from the tensors sampan's eager
models save for backward (saved-tensor hooks in ``tests/test_planner.py``), and the pipeline and
FSDP2 buffers from ``sampan simulate``, which runs fleet's own code for one rank of the layout on
fake tensors (docs/scale.md holds the comparison; it is what found most of the terms below).

Model state: parameters, gradients and AdamW's two moments, sharded over ``sharding x cp`` ranks
by FSDP2 at every ZeRO stage: 4 + 4 + 8 bytes per parameter (fp32: AMP level O1 is autocast over
fp32 parameters, and O2 keeps fp32 master weights), or 2 + 2 + 4 at O2 without master weights.

Activations per block and micro-batch follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models") in their element counts, with the byte sizes sampan
stores: the residual stream is fp32 (O1 / fp32) or bf16 (O2); matmul outputs are bf16 under AMP;
attention is ``scaled_dot_product_attention`` (flash: the output and a log-sum-exp, no ``s x s``
matrix); dropout masks are absent (dropout 0, as the zoo sets). A norm keeps its input (LayerNorm;
sampan's fp32 ``RMSNorm`` keeps an fp32 copy and the normalised tensor), and its output is kept
once more as the projections read it: once in the compute dtype, or, under O1 autocast, once per
projection, since each casts its own bf16 copy (autocast caches casts of weights, not of
activations). Context parallel divides every token-wise tensor by ``cp``, except the keys and
values attention gathers from the other ranks.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from sampan.planner.layout import Layout, Workload
from sampan.planner.model_shape import ModelShape

RESERVED_BYTES = 2.0e9
"""CUDA context, NCCL channels and allocator fragmentation: a fixed allowance per GPU (an assumption,
not measured here: there is no GPU on this machine)."""

def state_bytes(layout: Layout) -> tuple[int, int, int]:
    """Bytes per parameter of the sharded parameters, gradients and optimizer state."""
    if layout.amp_level == "O2" and not layout.master_weights:
        return 2, 2, 4
    return 4, 4, 8


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes on one GPU of the fullest pipeline stage: the model state at rest (``params``,
    ``grads``, ``optimizer``), ``buffers`` (working copies and receive buffers held through the
    step) and ``activations``: the rest of the fullest moment of the step, whose unsharded
    gradients, when micro-batches accumulate them, take the place of ``grads`` (they are reduced
    into it only after the last backward)."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    reserved: float = RESERVED_BYTES
    stage: int = 0
    """Which pipeline stage is the fullest (0 = first)."""
    expert_state: float = 0.0
    """Of ``params + grads + optimizer``, the routed experts' (MoE; already in those three)."""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers + self.reserved

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if not self.expert_state:  # a dense model's figures stay what they were
            out.pop("expert_state")
        return {**out, "total": self.total}


def stage_layers(model: ModelShape, layout: Layout, stage: int) -> int:
    """Blocks on pipeline rank ``stage``: fleet cuts the layers into ``pp x vpp`` chunks, earlier
    chunks one longer when uneven, and the rank runs chunks ``stage, stage + pp, ...``."""
    p, v = layout.pp, layout.vpp
    base, extra = divmod(model.layers, p * v)
    longer = min(v, max(0, -(-(extra - stage) // p)))  # the rank's chunks stage, stage + p, ... below extra
    return v * base + longer


def chunk_layer_ids(model: ModelShape, layout: Layout, chunk: int) -> range:
    """The layer indices of pipeline chunk ``chunk`` (of ``pp x vpp``), as fleet cuts them: equal
    chunks in order, earlier ones one longer when uneven."""
    base, extra = divmod(model.layers, layout.pp * layout.vpp)
    start = chunk * base + min(chunk, extra)
    return range(start, start + base + (chunk < extra))


def stage_layer_ids(model: ModelShape, layout: Layout, stage: int) -> list[int]:
    """The layer indices pipeline rank ``stage`` holds (its chunks ``stage, stage + pp, ...``)."""
    return [i for c in range(stage, layout.pp * layout.vpp, layout.pp) for i in chunk_layer_ids(model, layout, c)]


@functools.lru_cache(maxsize=4096)  # the search asks for the same few splits hundreds of thousands of times
def _chunk_moe_counts(layers: int, moe_layers: tuple[int, ...], chunks: int) -> tuple[tuple[int, int], ...]:
    """Per pipeline chunk, ``(layers, MoE layers)`` as fleet cuts ``layers`` into ``chunks``."""
    moe = set(moe_layers)
    base, extra = divmod(layers, chunks)
    out, start = [], 0
    for c in range(chunks):
        n = base + (c < extra)
        out.append((n, sum(1 for i in range(start, start + n) if i in moe)))
        start += n
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _fullest_moe_stage(layers: int, moe_layers: tuple[int, ...], pp: int, vpp: int) -> int:
    """The earliest pipeline rank holding the most MoE layers."""
    chunks = _chunk_moe_counts(layers, moe_layers, pp * vpp)
    per_stage = [sum(m for _, m in chunks[s::pp]) for s in range(pp)]
    return per_stage.index(max(per_stage))


def chunk_layer_counts(model: ModelShape, layout: Layout, chunk: int) -> tuple[int, int]:
    """``(layers, MoE layers)`` of pipeline chunk ``chunk``."""
    moe = model.moe.moe_layers if model.moe is not None else ()
    return _chunk_moe_counts(model.layers, moe, layout.pp * layout.vpp)[chunk]


def stage_layer_counts(model: ModelShape, layout: Layout, stage: int) -> tuple[int, int]:
    """``(layers, MoE layers)`` pipeline rank ``stage`` holds (its chunks ``stage, stage + pp, ...``)."""
    moe = model.moe.moe_layers if model.moe is not None else ()
    counts = _chunk_moe_counts(model.layers, moe, layout.pp * layout.vpp)[stage::layout.pp]
    return sum(n for n, _ in counts), sum(m for _, m in counts)


def _blocks_params(model: ModelShape, layout: Layout, counts: tuple[int, int]) -> float:
    """The non-expert parameters of ``counts = (layers, MoE layers)`` blocks on one tensor-parallel rank."""
    layers, n_moe = counts
    total = (layers - n_moe) * model.layer_params_per_mp(layout.mp)
    return total + n_moe * model.moe_layer_params_per_mp(layout.mp) if n_moe else total


def stage_params(model: ModelShape, layout: Layout, stage: int) -> float:
    """Parameters on one tensor-parallel rank of pipeline ``stage``, before ZeRO sharding, routed
    experts left out (:func:`stage_expert_params`: expert parallelism places them).

    Exact for sampan's plans (GPT / ERNIE ``block_plans``, Llama ``parallelize``): q / k / v and
    fc1 (gate / up) column-parallel, weights and biases split; out-proj / fc2 (down) row-parallel,
    weights split, biases replicated; norms (and Qwen3's q / k norms) and position embeddings
    replicated; the vocabulary split. With pp > 1 a tied head keeps its own copy on the last stage.
    MoE blocks: attention as above, router and shared experts whole (tensor parallel leaves them).
    """
    mp, pp = layout.mp, layout.pp
    vocab = model.padded_vocab(mp)
    if model.moe is None:
        total = stage_layers(model, layout, stage) * model.layer_params_per_mp(mp)
    else:
        total = _blocks_params(model, layout, stage_layer_counts(model, layout, stage))
    if stage == 0:
        total += vocab * model.hidden / mp + model.learned_positions * model.hidden
    if stage == pp - 1:
        total += model.norm_params + model.extra_params
        if not model.tied or pp > 1:
            total += vocab * model.hidden / mp
    return total


def stage_expert_params(model: ModelShape, layout: Layout, stage: int) -> float:
    """Routed-expert parameters on one rank of pipeline ``stage``: ``E / ep`` experts of each of its
    MoE blocks (whole on every tensor-parallel rank); 0 for a dense model."""
    if model.moe is None:
        return 0.0
    return stage_layer_counts(model, layout, stage)[1] * model.local_expert_params(layout.ep)


def _unit_params(model: ModelShape, layout: Layout) -> float:
    """One FSDP unit (a block) on one rank, unsharded: the largest of a dense block and an MoE block
    with its local experts."""
    unit = model.layer_params_per_mp(layout.mp)
    if model.moe is None:
        return unit
    moe = model.moe_layer_params_per_mp(layout.mp) + model.local_expert_params(layout.ep)
    return max(unit, moe) if model.num_moe_layers < model.layers else moe


@dataclasses.dataclass(frozen=True)
class _Bytes:
    """Bytes per element of what a layout computes with."""

    matmul: int
    """Matmul and attention outputs: 2 under AMP, 4 in fp32."""
    residual: int
    """The residual stream between blocks (and what crosses a pipeline boundary): bf16 at O2, else fp32."""
    autocast: bool
    """O1 under bf16: every projection casts its own bf16 copy of its input."""

    @classmethod
    def of(cls, layout: Layout, work: Workload) -> _Bytes:
        return _BYTES[(layout.amp_level == "O2", bool(work.amp))]


# (pure bf16 parameters asked for, AMP on) -> bytes: the planner's search asks millions of times.
_BYTES = {(pure, amp): _Bytes(2 if amp else 4, 2 if pure and amp else 4, amp and not pure)
          for pure in (False, True) for amp in (False, True)}


def _norm_bytes(model: ModelShape, b: _Bytes) -> int:
    """Per element, what one norm keeps itself: LayerNorm its input; sampan's RMSNorm an fp32 copy
    of its input and the normalised tensor (fp32, or bf16 at O2 where it is cast back before the scale)."""
    if model.norm == "layernorm":
        return b.residual
    return 4 + b.residual


def _consumer_bytes(b: _Bytes, projections: int) -> int:
    """Per element, a norm's output as the ``projections`` reading it keep it."""
    return 2 * projections if b.autocast else b.matmul


def tokens_per_rank(layout: Layout, work: Workload) -> float:
    """Tokens of one micro-batch a rank holds: its ``1 / cp`` of each of the ``micro_batch`` sequences."""
    return work.seq_len / layout.cp * layout.micro_batch


def layer_activation_bytes(model: ModelShape, layout: Layout, work: Workload, recompute: str) -> float:
    """Bytes one block keeps for backward, per micro-batch, on one rank.

    Recompute none, per block (``T`` tokens this rank holds, ``t`` tensor-parallel ranks, ``ln = t``
    with sequence parallel, else 1):

    * two norms: what each keeps itself (split by sequence parallel) and its output as the
      projections read it (whole-sequence even with sequence parallel: the column-parallel matmuls
      save the gathered input);
    * attention: q and its output ``H d`` wide, k and v ``KV d`` wide (the tensors flash attention
      saves, after RoPE; under context parallel the gathered keys and values of the whole
      sequence), the fp32 log-sum-exp over query heads; Qwen3's q / k norms add their fp32 input
      copy and normalised output;
    * the MLP: fc1's output and its activation, or SwiGLU's gate, SiLU(gate), up and their product.

    Selective keeps the block input and every matmul / attention output (sampan's op-level policy,
    as torchtitan's); full keeps only the block input.
    """
    s_all, h, f, a = work.seq_len, model.hidden, model.ffn, model.heads
    t, b = layout.mp, _Bytes.of(layout, work)
    tokens = tokens_per_rank(layout, work)
    kv_tokens = s_all * layout.micro_batch  # attention gathers every rank's keys and values
    ln = t if layout.sp else 1
    th = tokens * h
    if recompute == "full":            # only the block's input
        return b.residual * th / ln
    e = b.matmul
    lse = 4 * a * tokens / t
    if model.mla:
        attention = _mla_attention_bytes(model, layout, work, recompute)
        if recompute == "selective":
            return b.residual * th / ln + attention + model.mlp_in_matrices * e * tokens * f / t + 2 * e * th
        own = 2 * _norm_bytes(model, b) * th / ln
        consumers = (_consumer_bytes(b, 2) + _consumer_bytes(b, model.mlp_in_matrices)) * th
        return own + consumers + attention + 2 * model.mlp_in_matrices * e * tokens * f / t
    qkv_o = e * (2 * tokens * model.q_width + 2 * kv_tokens * model.kv_width) / t
    mlp = 2 * model.mlp_in_matrices * e * tokens * f / t
    if recompute == "selective":       # block input + every matmul / attention output (torchtitan-style)
        return b.residual * th / ln + qkv_o + lse + model.mlp_in_matrices * e * tokens * f / t + 2 * e * th
    own = 2 * _norm_bytes(model, b) * th / ln
    consumers = (_consumer_bytes(b, 3) + _consumer_bytes(b, model.mlp_in_matrices)) * th
    qk_norm = (4 + e) * tokens * (model.q_width + model.kv_width) / t if model.qk_norm else 0
    return own + consumers + qkv_o + lse + mlp + qk_norm


def _mla_attention_bytes(model: ModelShape, layout: Layout, work: Workload, recompute: str) -> float:
    """What multi-head latent attention keeps for backward, per micro-batch on one rank, besides the
    block's input norm (recompute "none" or "selective").

    None: the down-projections' outputs (``r_q``, and ``r_kv + d_rope`` wide; whole on every
    tensor-parallel rank, as they are replicated), each latent norm's own tensors and its output as
    the up-projection reads it, the up-projections' outputs (q ``H d_qk``; the decompressed keys'
    and values' ``H (d_nope + d_v)``), the keys with their rotary part joined (``H d_qk``), the
    attention output ``H d_v`` and the fp32 log-sum-exp. Selective keeps the matmul and attention
    outputs only. Keys and values cover the whole sequence under context parallel (gathered)."""
    b = _Bytes.of(layout, work)
    e, t = b.matmul, layout.mp
    tokens = tokens_per_rank(layout, work)
    kv_tokens = work.seq_len * layout.micro_batch
    a = model.heads
    latents = model.q_lora_rank + model.kv_lora_rank
    down = e * tokens * (latents + model.qk_rope_head_dim)
    q = tokens * model.q_width
    kv_b = kv_tokens * a * (model.qk_nope_head_dim + model.v_head_dim)
    out = tokens * model.v_width
    lse = 4 * a * tokens / t
    if recompute == "selective":  # the matmul outputs (q_a, kv_a, q_b, kv_b, attention; o is the caller's)
        return down + e * (q + kv_b + out) / t + lse
    keys = kv_tokens * model.q_width
    norms = (_norm_bytes(model, b) + _consumer_bytes(b, 1)) * tokens * latents
    return down + norms + e * (q + kv_b + keys + out) / t + lse


def moe_layer_activation_bytes(model: ModelShape, layout: Layout, work: Workload, recompute: str) -> float:
    """Bytes one MoE block keeps for backward, per micro-batch, on the busiest expert-parallel rank.

    Attention and the input norm as a dense block's (:func:`layer_activation_bytes`). The MoE
    part is whole on every tensor-parallel rank (tensor parallel leaves MoE blocks replicated) and
    sees all ``T`` tokens; ``k`` routed copies of each go through the experts, and the busiest rank
    receives ``k T x Workload.load_factor(ep)`` of them. As ``sampan.nn.MoE`` keeps them (measured
    with saved-tensor hooks on the tiny MoE families, tests/test_planner_moe.py), recompute none:

    * the router: its fp32 input copy (the router's math is fp32; without AMP the norm output
      itself) and its fp32 scores ``[T, E]``;
    * the dispatched token copies ``[k T lf, h]`` (after the all-to-all, or sorted without expert
      parallelism), saved by the experts' gate/up GEMM, and the two int64 orderings of the copies;
    * the experts' SwiGLU: gate/up output, SiLU(gate), their product: ``4 f_e`` per copy;
    * the combine: the expert outputs back on the token's rank and their weighted copy (the
      multiplication and the index_add each keep one), ``2 x [k T, h]``;
    * the shared experts' SwiGLU (``4 f_s`` per token) and the norm output as they read it.

    The experts run in the residual stream's dtype: grouped GEMMs are not autocast, so under O1
    (fp32 parameters) they compute in fp32; bf16 at O2.

    Selective keeps the block input, the attention and matmul outputs, the router's scores and the
    all-to-all's output (communication is not recomputed, as torchtitan's policy); full the input.
    """
    moe, h = model.moe, model.hidden
    b = _Bytes.of(layout, work)
    e, t, x = b.matmul, layout.mp, b.residual
    tokens = tokens_per_rank(layout, work)
    th = tokens * h
    ln = t if layout.sp else 1
    if recompute == "full":
        return b.residual * th / ln
    k, lf = moe.top_k, work.load_factor(layout.ep)
    routed = tokens * k * lf               # token copies the busiest rank's experts run
    fe, fs = moe.expert_intermediate_size, moe.shared_intermediate_size
    router = 4 * tokens * moe.num_experts
    if model.mla:
        attention = _mla_attention_bytes(model, layout, work, recompute)
        readers = 2
    else:
        lse = 4 * model.heads * tokens / t
        kv_tokens = work.seq_len * layout.micro_batch
        attention = e * (2 * tokens * model.q_width + 2 * kv_tokens * model.kv_width) / t + lse
        if recompute == "none" and model.qk_norm:
            attention += (4 + e) * tokens * (model.q_width + model.kv_width) / t
        readers = 3
    if recompute == "selective":
        shared = (2 * e * tokens * fs + e * th) if fs else 0.0
        return (b.residual * th / ln + attention + e * th + router + x * routed * h + 2 * x * routed * fe
                + x * tokens * k * h + shared)
    own = 2 * _norm_bytes(model, b) * th / ln
    gate = model.shared_expert_gate and fs > 0
    if work.amp:  # the router's fp32 copy, and the shared experts' (and their gate's) reading of the norm output
        mlp_input = 4 * th + (_consumer_bytes(b, 2 + gate) * th if fs else 0.0)
    else:         # one fp32 norm output, read by all
        mlp_input = 4 * th
    experts = x * routed * (h + 4 * fe) + 2 * x * tokens * k * h + 16 * tokens * k
    shared = 4 * e * tokens * fs
    if gate:      # Qwen2-MoE: sigmoid(gate(x)) * shared keeps the shared output and the sigmoid
        shared += e * th + e * tokens
    return own + _consumer_bytes(b, readers) * th + attention + mlp_input + router + experts + shared


def moe_transient_bytes(model: ModelShape, layout: Layout, work: Workload) -> float:
    """What an MoE block holds for a moment beyond what it keeps, as its forward (or its recompute in
    backward) combines the experts' results: their outputs gathered back from the padded / grouped
    GEMM and, with expert parallelism, that copy re-sorted for the return all-to-all and the
    all-to-all's result, ``(2 lf + 1) k T`` rows of ``h`` (without: the outputs and their weighted
    copy, ``2 k T``). Measured by ``sampan simulate`` on DeepSeek-V3 and ERNIE 4.5 at their layouts."""
    if model.moe is None:
        return 0.0
    b = _Bytes.of(layout, work)
    copies = tokens_per_rank(layout, work) * model.moe.top_k
    rows = (2 * work.load_factor(layout.ep) + 1) * copies if layout.ep > 1 else 2 * copies
    return b.residual * rows * model.hidden


def block_input_alias_bytes(model: ModelShape, layout: Layout, work: Workload, recompute: str) -> float:
    """Of a block's kept bytes, those that are its input tensor itself: for the first block of a
    pipeline chunk that is the receive buffer, already counted there."""
    b = _Bytes.of(layout, work)
    th = tokens_per_rank(layout, work) * model.hidden / (layout.mp if layout.sp else 1)
    if recompute == "full" or model.norm == "layernorm" or b.residual == 4:
        return b.residual * th     # checkpoint's saved input; LayerNorm's input; RMSNorm's no-op fp32 copy
    return 0.0                     # O2 RMSNorm keeps a new fp32 copy, not its input


def offloaded_input_bytes(model: ModelShape, layout: Layout, work: Workload) -> float:
    """Of a recomputed block's kept bytes per micro-batch, those of its input, which offload keeps in
    host memory instead (0 without offload); backward brings one block's back while it recomputes."""
    if not layout.offload:
        return 0.0
    b = _Bytes.of(layout, work)
    return b.residual * tokens_per_rank(layout, work) * model.hidden / (layout.mp if layout.sp else 1)


@functools.lru_cache(maxsize=65536)
def in_flight_states(pp: int, vpp: int, num_micro: int, rank: int,
                     schedule: str) -> tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]:
    """The moments of a step where pipeline rank ``rank``'s memory can peak, as torch's schedules
    order its work: after each forward (moment 0) and as each backward starts (moment 1), how many
    micro-batches await backward on each of the rank's chunks, and where each chunk's gradients
    are: 0 before its first backward, 1 accumulating (unsharded, from its first backward to its
    last), 2 reduced into the sharded gradients (torch reduces a chunk as soon as its last
    backward has run; measured on gloo).

    Without a pipeline micro-batches run one after the other. GPipe runs every forward first.
    1F1B warms up with ``min(m, pp - rank)`` forwards, then alternates one backward and one
    forward. Interleaved 1F1B (torch's ``ScheduleInterleaved1F1B``) warms up with
    ``(vpp - 1) x micro-batches-per-round + 2 (pp - 1 - rank)`` forwards, filling its chunks in order
    (depth first), then alternates one forward and one backward, running the chunks' backwards in
    reverse order. Which chunk holds the micro-batches in flight matters (the chunks hold different
    layer counts, and the last sends nothing on), and so does whether a backward has run: with
    every forward in the warm-up (a step of few micro-batches) the activation peak comes before any
    gradient exists. Torch-free, so planning stays fast; cached, since the search asks often.
    """
    p, v, m = pp, vpp, num_micro
    counts, backwards = [0] * v, [0] * v
    states = []

    def state(moment: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        return moment, tuple(counts), tuple(0 if b == 0 else 1 if b < m else 2 for b in backwards)

    def forward(chunk: int) -> None:
        counts[chunk] += 1
        states.append(state(0))

    def backward(chunk: int) -> None:
        states.append(state(1))  # as it starts: its micro-batch's activations are all still there
        counts[chunk] -= 1
        backwards[chunk] += 1

    if p == 1:
        for _ in range(m):
            forward(0)
            backward(0)
    elif schedule == "GPipe":
        for _ in range(m):
            forward(0)
        for _ in range(m):
            backward(0)
    elif v == 1:
        warmup = min(m, p - rank)
        for _ in range(warmup):
            forward(0)
        for step in range(m):
            backward(0)
            if warmup + step < m:
                forward(0)
    else:
        rounds = max(1, m // p)
        per_round = m // rounds
        total = m * v
        warmup = min((v - 1) * per_round + 2 * (p - 1 - rank), total)
        for step in range(warmup):
            forward((step // per_round) % v)
        for step in range(total - warmup):  # steady state: one forward, then one backward
            forward(((warmup + step) // per_round) % v)
            backward(v - 1 - (step // per_round) % v)
        for step in range(total - warmup, total):  # cool-down: the backwards left
            backward(v - 1 - (step // per_round) % v)
    return tuple(set(states))


def boundary_bytes(model: ModelShape, layout: Layout, work: Workload) -> float:
    """What crosses a pipeline boundary per micro-batch: the residual stream of this rank's tokens
    (a ``1 / mp`` sequence shard of it with sequence parallel)."""
    b = _Bytes.of(layout, work)
    return b.residual * tokens_per_rank(layout, work) * model.hidden / (layout.mp if layout.sp else 1)


def receive_buffer_bytes(model: ModelShape, layout: Layout, work: Workload, stage: int) -> float:
    """The receive buffers torch's pipeline allocates up front, for the whole step, on rank ``stage``:
    one per micro-batch for the activations of every chunk but the first, and for the gradients of
    every chunk but the last."""
    if layout.pp == 1:
        return 0.0
    chunks = layout.pp * layout.vpp
    receives = sum((c != 0) + (c != chunks - 1) for c in range(stage, chunks, layout.pp))
    return layout.num_micro * receives * boundary_bytes(model, layout, work)


def head_activation_bytes(model: ModelShape, layout: Layout, work: Workload) -> float:
    """The last stage's final norm, the head's input and the fp32 log-softmax of its logits (split by
    vocabulary over mp: the parallel cross-entropy, with and without a pipeline)."""
    b = _Bytes.of(layout, work)
    th = tokens_per_rank(layout, work) * model.hidden
    logits = 4 * tokens_per_rank(layout, work) * model.padded_vocab(layout.mp) / layout.mp
    norm = _norm_bytes(model, b) * th / (layout.mp if layout.sp else 1)
    return logits + norm + _consumer_bytes(b, 1) * th


def memory(model: ModelShape, layout: Layout, work: Workload) -> Memory:
    """The fullest stage's :class:`Memory`. Checks the first and the last stage (the embedding, the
    head, the most micro-batches in flight) and, for an MoE model with dense layers first, the
    earliest stage holding the most MoE layers (ERNIE-4.5-300B's stage 1: five MoE layers against
    stage 0's two, and one micro-batch fewer in flight, is its fullest)."""
    stages = {0, layout.pp - 1}
    if model.moe is not None and layout.pp > 2:
        stages.add(_fullest_moe_stage(model.layers, model.moe.moe_layers, layout.pp, layout.vpp))
    best = None
    for stage in sorted(stages):
        mem = stage_memory(model, layout, work, stage)
        if best is None or mem.total > best.total:
            best = mem
    return best


def chunk_params(model: ModelShape, layout: Layout, chunk: int) -> float:
    """Parameters of pipeline chunk ``chunk`` (of ``pp x vpp``) on one tensor-parallel rank, routed
    experts left out (:func:`chunk_expert_params`)."""
    chunks = layout.pp * layout.vpp
    base, extra = divmod(model.layers, chunks)
    vocab = model.padded_vocab(layout.mp)
    if model.moe is None:
        total = (base + (chunk < extra)) * model.layer_params_per_mp(layout.mp)
    else:
        total = _blocks_params(model, layout, chunk_layer_counts(model, layout, chunk))
    if chunk == 0:
        total += vocab * model.hidden / layout.mp + model.learned_positions * model.hidden
    if chunk == chunks - 1:
        total += model.norm_params + model.extra_params
        if not model.tied or layout.pp > 1:
            total += vocab * model.hidden / layout.mp
    return total


def chunk_expert_params(model: ModelShape, layout: Layout, chunk: int) -> float:
    """Routed-expert parameters of pipeline chunk ``chunk`` on one expert-parallel rank."""
    if model.moe is None:
        return 0.0
    return chunk_layer_counts(model, layout, chunk)[1] * model.local_expert_params(layout.ep)


def _in_flight_bytes(model: ModelShape, layout: Layout, work: Workload, stage: int, grad_bytes: float,
                     reduced_bytes: float, backward_bytes: float, reduced_expert_bytes: float = 0.0) -> float:
    """The activations and accumulated gradients rank ``stage`` holds at its fullest moment of the step.

    Activations: per micro-batch in flight on a chunk, every block's kept bytes, less the first
    block's input where that is the receive buffer (counted there), plus the chunk's output, kept
    for its backward besides being sent on; the model's last chunk keeps the head's instead, and a
    forward through it peaks at its loss (:func:`loss_transient_bytes`). Gradients: ``grad_bytes``
    per parameter of each chunk between its first and last backward (unsharded gradients
    accumulating over the step's micro-batches; 0 when they are reduced at once), ``reduced_bytes``
    per parameter of each chunk already reduced (its sharded gradients; ``reduced_expert_bytes`` per
    routed-expert parameter, sharded over fewer ranks)."""
    chunks = layout.pp * layout.vpp
    base, extra = divmod(model.layers, chunks)
    offloaded = offloaded_input_bytes(model, layout, work)
    per_layer = layer_activation_bytes(model, layout, work, layout.recompute) - offloaded
    # The first block's input is the receive buffer (counted there), unless only its host copy is kept.
    alias = block_input_alias_bytes(model, layout, work, layout.recompute) if layout.pp > 1 and not offloaded else 0.0
    bnd = boundary_bytes(model, layout, work)
    per_moe = (moe_layer_activation_bytes(model, layout, work, layout.recompute) - offloaded
               if model.moe is not None else 0.0)
    weights, accumulating, reduced = [], [], []
    for c in range(stage, chunks, layout.pp):
        layers = base + (c < extra)
        out = head_activation_bytes(model, layout, work) if c == chunks - 1 else bnd
        q = chunk_params(model, layout, c)
        if model.moe is None:
            weights.append(layers * per_layer - (c != 0) * alias + out)
            accumulating.append(grad_bytes * q)
            reduced.append(reduced_bytes * q)
        else:
            n_moe = chunk_layer_counts(model, layout, c)[1]
            weights.append((layers - n_moe) * per_layer + n_moe * per_moe - (c != 0) * alias + out)
            experts = chunk_expert_params(model, layout, c)
            accumulating.append(grad_bytes * (q + experts))
            reduced.append(reduced_bytes * q + reduced_expert_bytes * experts)
    # A candidate moment is a vector of what it holds, per chunk: micro-batches in flight,
    # accumulating gradients, reduced gradients; then a forward's loss, a backward's working set.
    coefficients = (*weights, *accumulating, *reduced, loss_transient_bytes(model, layout, work), backward_bytes)
    candidates = peak_candidates(layout.pp, layout.vpp, layout.num_micro, stage, layout.schedule)
    return max(sum(x * c for x, c in zip(vector, coefficients, strict=True)) for vector in candidates)


@functools.lru_cache(maxsize=65536)
def peak_candidates(pp: int, vpp: int, num_micro: int, rank: int, schedule: str) -> tuple[tuple[int, ...], ...]:
    """:func:`in_flight_states` as vectors (per chunk: micro-batches in flight, gradients
    accumulating (0 / 1), gradients reduced (0 / 1); then "a forward through the model's last chunk"
    and "a backward starting"), keeping only those no other one holds at least as much of in every
    entry: memory is a sum of these with non-negative weights, so its largest value is among them."""
    last = rank == pp - 1  # the rank holding the model's last chunk (its own last chunk)
    vectors = set()
    for when, counts, phases in in_flight_states(pp, vpp, num_micro, rank, schedule):
        vectors.add((*counts, *(int(p == 1) for p in phases), *(int(p == 2) for p in phases),
                     int(when == 0 and last and counts[-1] > 0), int(when == 1)))
    ordered = sorted(vectors, key=sum, reverse=True)
    kept: list[tuple[int, ...]] = []
    for vector in ordered:
        if not any(all(a >= b for a, b in zip(other, vector, strict=True)) for other in kept):
            kept.append(vector)
    return tuple(kept)


def context_mask_bytes(layout: Layout, work: Workload) -> float:
    """Context parallel's attention masks on the context rank that holds the most (rank 0): a bool
    mask of which keys each of its queries sees, ``c x c`` for its early chunk and ``c x s`` for its
    late one (``c = s / 2 cp``), kept for the step, and the additive copy of the one in use that
    attention makes (bf16 under AMP)."""
    if layout.cp == 1:
        return 0.0
    c = work.seq_len / (2 * layout.cp)
    elements = c * c + c * work.seq_len
    return elements * (1 + (2 if work.amp else 4))


def loss_transient_bytes(model: ModelShape, layout: Layout, work: Workload) -> float:
    """What computing the loss holds for a moment besides the saved log-softmax: the vocabulary-parallel
    cross-entropy (mp > 1) builds its log-softmax from four fp32 ``[tokens, vocab / mp]`` tensors
    (shifted, exponentiated, ...; measured in ``sampan simulate``); plain cross-entropy only the fp32
    copy of bf16 logits."""
    logits = 4 * tokens_per_rank(layout, work) * model.padded_vocab(layout.mp) / layout.mp
    if layout.mp > 1:
        return 4 * logits
    return logits if work.amp else 0.0


def expert_shard_divisor(model: ModelShape, layout: Layout) -> float:
    """What the routed experts' state on one expert-parallel rank is divided by on one rank of its
    ``Layout.expert_shard_ranks``, as fleet shards the stacked weights ``gate_up [E_l, 2 f_e, h]``
    and ``down [E_l, h, f_e]`` (``sampan.distributed.sharding.expert_shard_placement``): evenly along
    the first dimension the ranks divide, else by expert, where FSDP2 pads every rank to
    ``ceil(E_l / ranks)`` experts (ERNIE-4.5-300B's 8 local experts over 21 ranks: 8, not 21)."""
    ranks = layout.expert_shard_ranks
    if model.moe is None or ranks == 1:
        return float(ranks)
    local = model.moe.num_experts // layout.ep
    h, f = model.hidden, model.moe.expert_intermediate_size
    held = 0.0  # of the local experts' parameters, the share one shard rank holds
    for shape, weight in (((local, 2 * f, h), 2 / 3), ((local, h, f), 1 / 3)):
        even = any(d % ranks == 0 for d in shape)
        held += weight * (1 / ranks if even else math.ceil(local / ranks) / local)
    return 1 / held


def stage_memory(model: ModelShape, layout: Layout, work: Workload, stage: int) -> Memory:
    """What one GPU of pipeline stage ``stage`` holds at its step's peak (``memory`` takes the
    worst stage); ``sampan simulate`` compares it with fleet's own code on fake tensors.

    An MoE model's routed experts (``E / ep`` per MoE block on each expert-parallel rank) keep
    their state sharded over ``Layout.expert_shard_ranks`` instead of ``sharding x cp``; what they
    hold of parameters, gradients and optimizer state is ``Memory.expert_state``."""
    n = stage_params(model, layout, stage)
    ne = stage_expert_params(model, layout, stage)
    shard = layout.shard_ranks
    p_bytes, g_bytes, o_bytes = state_bytes(layout)
    params, grads, optim = p_bytes * n / shard, g_bytes * n / shard, o_bytes * n / shard
    expert_state = 0.0
    if ne:
        eshard = expert_shard_divisor(model, layout)
        params, grads, optim = params + p_bytes * ne / eshard, grads + g_bytes * ne / eshard, optim + o_bytes * ne / eshard
        expert_state = (p_bytes + g_bytes + o_bytes) * ne / eshard
    local = n + ne if ne else n  # every parameter this rank computes with, unsharded
    # FSDP2's unsharded parameters are views into its all-gather output, padded when the experts
    # shard unevenly (expert_shard_divisor)
    gathered_params = n + ne * layout.expert_shard_ranks / eshard if ne else n
    b = _Bytes.of(layout, work)
    buffers = receive_buffer_bytes(model, layout, work, stage) + context_mask_bytes(layout, work)
    if b.autocast:  # autocast's bf16 copies of the weights, cached for the step and saved by the matmuls
        buffers += 2 * local
    unit = _unit_params(model, layout)  # one FSDP unit (a block), unsharded
    accumulating = reduced = reduced_expert = 0.0  # bytes per parameter of unsharded gradients, and once reduced
    if layout.fsdp:
        gathered = 2 if b.residual == 2 else p_bytes   # O2 gathers bf16 copies; O1 the fp32 parameters
        if layout.stage == 3:  # one block gathered, the next prefetched; one block's gradient before reduce-scatter
            buffers += 3 * gathered * unit
        elif layout.num_micro > 1:
            # Parameters stay gathered from forward to backward and gradients accumulate unsharded
            # from each chunk's first backward to the step's last; only then are they reduced into
            # the sharded gradients, which therefore never exist beside them (counting both
            # overstated GPT-3 175B at t8 x p16 x d8 by 5.8 GB a rank: sampan simulate).
            accumulating = 2 if (b.residual == 2 and not layout.master_grads) else 4
            reduced = g_bytes / shard
            reduced_expert = g_bytes / expert_shard_divisor(model, layout)
            buffers += gathered * gathered_params
        else:  # parameters stay gathered from forward to backward; one block's gradient before reduction
            buffers += gathered * gathered_params + gathered * unit
    # As a block's backward runs: its weights' fresh gradients (bf16 under AMP, plus the fp32 cast
    # for autocast's fp32 parameters) and, with recompute, its rebuilt activations.
    backward = unit * ((2 + 4 * b.autocast) if work.amp else 4)
    if layout.recompute != "none":
        rebuilt = (layer_activation_bytes(model, layout, work, "none")
                   - layer_activation_bytes(model, layout, work, layout.recompute))
        if model.moe is not None:
            rebuilt = max(rebuilt, moe_layer_activation_bytes(model, layout, work, "none")
                          - moe_layer_activation_bytes(model, layout, work, layout.recompute))
        backward += rebuilt + offloaded_input_bytes(model, layout, work)
    backward += moe_transient_bytes(model, layout, work)
    acts = _in_flight_bytes(model, layout, work, stage, accumulating, reduced, backward, reduced_expert)
    if accumulating:  # the moments priced hold their gradients (accumulating or reduced) themselves
        acts -= grads
    return Memory(params, grads, optim, acts, buffers, RESERVED_BYTES, stage, expert_state)

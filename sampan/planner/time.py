"""Seconds per optimizer step of a layout, split into where the time goes.

* compute: the stage's FLOPs (``6 N + 12 L H d s`` per token, ``H d = h`` for GPT, the attention
  term halved for causal models, whose kernels skip the masked half, plus one more forward of the
  blocks with full recompute) at ``Hardware.efficiency(h)`` of peak (a curve in the model's width);
* tensor parallel: 4 all-reduces of ``b s h`` activations per block and micro-batch (2 forward,
  after the row-parallel out-proj and fc2 / down; 2 backward, of the column-parallel q k v and
  fc1 / gate-up input gradients, each reduced once as sampan's plans share that input; all-gather
  + reduce-scatter with sequence parallel, the same bytes), plus the vocabulary-parallel
  embedding's; 2 more per block with full recompute. They are ``h`` wide whatever the heads: GQA
  narrows k and v inside a rank, not what crosses ranks. Sampan does not overlap them with
  compute (DTensor runs them in line);
* context parallel: an all-gather of each block's keys and values over the ``cp`` ranks in
  forward (again with full recompute) and a reduce-scatter of their gradients in backward,
  in line like tensor parallel's;
* pipeline: the bubble, ``(p - 1) / v`` micro-batch slots of a stage (``v = 1`` for 1F1B and
  GPipe, ``vpp`` interleaved), and the point-to-point sends of the residual stream per boundary
  (fp32, or bf16 at O2; a ``1 / mp`` sequence shard with sequence parallel), on the critical path;
* data parallel / sharding: FSDP2's collectives over ``dp`` and ``sharding x cp``: all-gathers of
  the parameters (fp32 at O1, bf16 at O2) and reductions of the gradients (fp32, or bf16 at O2
  without master gradients): all-reduce over ``dp``, reduce-scatter + all-gather over the shard
  ranks (ZeRO-3: all-gather twice and reduce-scatter per micro-batch). FSDP2 prefetches the next
  block's all-gather and issues reduce-scatters while backward continues, so these overlap with
  the micro-batch they belong to; one block's worth stays exposed at each end;
* optimizer: AdamW reads and writes its state once (device-memory bound);
* offload: each block's input copied to the host in forward and back for its recompute, at
  ``Hardware.host_gbps``, on the compute stream (sampan does not overlap these copies);
* Mixture of Experts: compute is the ACTIVE FLOPs (router, shared experts, ``top_k`` routed
  experts per token), the routed experts' share stretched by ``Workload.moe_load_factor`` (the
  busiest expert-parallel rank's tokens over the mean; the step waits for it). MoE blocks are
  whole on every tensor-parallel rank (the MoE contract), so their FLOPs are not divided by mp.
  Expert parallelism: per MoE block and micro-batch, four all-to-alls of the ``k T`` routed token
  copies ``h`` wide (dispatch and combine in forward, their gradients in backward; two more with
  full recompute): bf16, the forward dispatch in FP8 when ``Workload.fp8``; the busiest rank
  moves ``moe_load_factor`` times the mean. Over NVLink when the ep group fits in a node, else
  the share bound for other nodes over the network (the in-node share over NVLink meanwhile).
  Sampan issues them in line (fleet's hooks around the experts), so they are on the critical
  path, not overlapped with compute (DeepSeek-V3's DualPipe overlaps them; sampan does not);
  ``StepTime.expert_parallel``. Expert gradients are reduced over the ``dp x sharding / ep``
  ranks that hold the same experts, beside the rest (FSDP2, overlapped as above);
* FP8 (``Workload.fp8``): the blocks' linear layers (attention projections, MLPs, experts) at
  ``Hardware.fp8_peak_flops``; attention's score and value products, the router and the head at
  the bf16 peak; the same efficiency for both.

Collectives use the alpha-beta ring model over the slowest link of the group: a group whose ranks
span more GPUs than a node holds crosses the network.
"""

from __future__ import annotations

import dataclasses
import math

from sampan.planner.hardware import Hardware
from sampan.planner.layout import Layout, Workload
from sampan.planner.memory import (
    boundary_bytes,
    offloaded_input_bytes,
    stage_expert_params,
    stage_layer_counts,
    stage_params,
    state_bytes,
    tokens_per_rank,
)
from sampan.planner.model_shape import ModelShape


@dataclasses.dataclass(frozen=True)
class StepTime:
    """Seconds per step by component; ``total`` is what one step takes."""

    compute: float
    tensor_parallel: float
    bubble: float
    pipeline_p2p: float
    data_parallel: float
    optimizer: float
    offload: float = 0.0
    """Activation offload's device-host copies (on the compute stream, so not hidden)."""
    expert_parallel: float = 0.0
    """MoE: the all-to-alls that carry token copies to their experts and back (in line, not hidden)."""

    @property
    def total(self) -> float:
        total = (self.compute + self.tensor_parallel + self.bubble + self.pipeline_p2p + self.data_parallel
                 + self.optimizer + self.offload)
        return total + self.expert_parallel if self.expert_parallel else total

    @property
    def bottleneck(self) -> str:
        parts = {"compute": self.compute, "TP comm": self.tensor_parallel, "bubble": self.bubble,
                 "p2p": self.pipeline_p2p, "DP comm": self.data_parallel, "optimizer": self.optimizer,
                 "offload": self.offload}
        if self.expert_parallel:
            parts["EP all-to-all"] = self.expert_parallel
        name = max(parts, key=parts.get)
        if name == "compute":  # say what else costs most, as the thing to watch
            others = {k: v for k, v in parts.items() if k != "compute"}
            second = max(others, key=others.get)
            return f"compute; next {second} {others[second] / self.total:.0%}"
        return f"{name} {parts[name] / self.total:.0%}"

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if not self.expert_parallel:  # a dense model's figures stay what they were
            out.pop("expert_parallel")
        return {**out, "total": self.total, "bottleneck": self.bottleneck}


def ring_time(kind: str, nbytes: float, ranks: int, link: tuple[float, float]) -> float:
    """Alpha-beta time of a ring ``all_reduce`` / ``all_gather`` / ``reduce_scatter`` of ``nbytes`` (the full
    tensor) over ``ranks`` ranks, or a ``p2p`` send of ``nbytes``."""
    alpha, bandwidth = link
    if kind == "p2p":
        return alpha + nbytes / bandwidth
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    steps = 2 * (ranks - 1) if kind == "all_reduce" else ranks - 1
    return steps * alpha + steps / ranks * nbytes / bandwidth


def _crosses(ranks: int, stride: int, hw: Hardware) -> bool:
    """Whether a group of ``ranks`` ranks ``stride`` apart spans more than one node."""
    return ranks > 1 and ranks * stride > hw.gpus_per_node


def step_time(model: ModelShape, layout: Layout, work: Workload, hw: Hardware, overlap: bool = True) -> StepTime:
    """Predicted :class:`StepTime`. ``overlap=False`` prices every collective on the critical path
    (what CPU gloo ranks sharing cores do)."""
    s, h = work.seq_len, model.hidden
    p, m, t, v = layout.pp, layout.num_micro, layout.mp, layout.vpp
    e = 2 if work.amp else 4
    layers = math.ceil(model.layers / p)
    tokens_mb = tokens_per_rank(layout, work)  # this rank's tokens of one micro-batch (1 / cp of each sequence)

    # -- compute of one micro-batch on the busiest stage (the blocks, plus the head on the last) --
    # As flops_per_token counts, except that a causal model's attention computes only the query-key
    # pairs its mask keeps: flash attention skips the masked half, and sampan's context parallel
    # attends each chunk to the keys before it (about the same half). ERNIE attends both ways.
    attention = model.attention_flops_per_position() * s * (1.0 if model.family == "ernie" else 0.5)
    block_flops = (6 * model.layer_params + attention) * tokens_mb / t
    head_flops = 6 * model.vocab * h * tokens_mb / t
    recompute_flops = block_flops / 3 if layout.recompute == "full" else 0.0  # one more forward
    flops_mb = layers * (block_flops + recompute_flops) + head_flops  # the last stage: blocks + head
    rate = hw.peak_flops * hw.efficiency(model.hidden)
    compute_mb = flops_mb / rate
    a2a_mb = 0.0  # MoE all-to-all per micro-batch on the busiest stage
    if not model.uniform or work.fp8:  # the busiest stage, by its compute and exposed all-to-all
        compute_mb, a2a_mb = max((_stage_compute(model, layout, work, hw, stage, attention) for stage in range(p)),
                                 key=sum)

    # -- tensor parallel, per micro-batch ----------------------------------------------------------
    tp_mb = 0.0
    if t > 1:
        link = hw.link(_crosses(t, 1, hw))
        per_layer = 4 + (2 if layout.recompute == "full" else 0)
        one = ring_time("all_reduce", e * tokens_mb * h, t, link)
        tp_mb = (layers * per_layer + 2) * one

    # -- context parallel, per micro-batch: gather K and V (forward, and recompute), reduce-scatter
    # their gradients (backward) --------------------------------------------------------------------
    if layout.cp > 1:
        link = hw.link(_crosses(layout.cp, t, hw))
        kv = e * 2 * s * layout.micro_batch * model.kv_width / t  # the gathered keys and values, whole sequence
        gathers = 2 if layout.recompute == "full" else 1
        tp_mb += layers * (gathers * ring_time("all_gather", kv, layout.cp, link)
                           + ring_time("reduce_scatter", kv, layout.cp, link))

    # -- activation offload, per micro-batch: each block's input to the host in forward and back
    # for its recompute, copied on the compute stream (sampan does not overlap them) ----------------
    offload_mb = 2 * layers * offloaded_input_bytes(model, layout, work) / (hw.host_gbps * 1e9)

    slot = compute_mb + tp_mb + offload_mb  # one micro-batch through one stage, forward + backward
    if a2a_mb:
        slot += a2a_mb
    compute = m * compute_mb
    tensor_parallel = m * tp_mb
    bubble = (p - 1) / v * slot if p > 1 else 0.0

    # -- pipeline point-to-point: each boundary sends activations forward and gradients back ------
    p2p = 0.0
    if p > 1:
        stride = layout.dp * layout.sharding * layout.cp * t
        link = hw.link(stride >= hw.gpus_per_node)
        one = ring_time("p2p", boundary_bytes(model, layout, work), 2, link)
        p2p = 2 * (m + (p - 1) * v) * one  # every micro-batch crosses each of this rank's boundaries

    # -- data parallel / sharding (FSDP2, fp32) ----------------------------------------------------
    n_stage = max(stage_params(model, layout, 0), stage_params(model, layout, p - 1))
    pure = layout.amp_level == "O2" and bool(work.amp)
    gather_bytes = (2 if pure else state_bytes(layout)[0]) * n_stage
    grad_bytes = (2 if pure and not layout.master_grads else 4) * n_stage
    unit_frac = 1 / max(layers, 1)
    dp_comm = 0.0
    shard = layout.shard_ranks
    sh_link = hw.link(_crosses(shard, t, hw))
    dp_link = hw.link(_crosses(layout.dp, t * shard, hw))
    if shard > 1:
        rs = ring_time("reduce_scatter", grad_bytes, shard, sh_link)
        ag = ring_time("all_gather", gather_bytes, shard, sh_link)
        ar = ring_time("all_reduce", grad_bytes / shard, layout.dp, dp_link)
        if layout.stage == 3:  # gathered for forward and again for backward, reduced every micro-batch
            per_mb = 2 * ag + rs + ar
            dp_comm = m * _exposed(per_mb, slot, unit_frac, overlap)
        else:  # gathered once (first forward), reduced once (last backward)
            dp_comm = _exposed(ag, slot / 3, unit_frac, overlap) + _exposed(rs + ar, 2 * slot / 3, unit_frac, overlap)
    elif layout.dp > 1:
        ar = ring_time("all_reduce", grad_bytes, layout.dp, dp_link)
        dp_comm = _exposed(ar, 2 * slot / 3, unit_frac, overlap)

    # -- optimizer: AdamW reads params, grads, two moments and writes three (fp32) ---------------
    optimizer = 7 * state_bytes(layout)[0] * n_stage / shard / (hw.hbm_gbps * 1e9)
    if model.moe is None:
        return StepTime(compute, tensor_parallel, bubble, p2p, dp_comm, optimizer, m * offload_mb)
    # -- MoE: the routed experts' gradients over the ranks holding the same experts ----------------
    ne = max(stage_expert_params(model, layout, stage) for stage in range(p))
    eshard, edp = layout.expert_shard_ranks, layout.expert_data_ranks
    per_param = (2 if pure else state_bytes(layout)[0], 2 if pure and not layout.master_grads else 4)
    stride = layout.ep * layout.cp * t  # the expert-data ranks lie ep x cp x mp apart in the mesh
    if eshard > 1:
        e_link = hw.link(_crosses(eshard, stride, hw))
        rs = ring_time("reduce_scatter", per_param[1] * ne, eshard, e_link)
        ag = ring_time("all_gather", per_param[0] * ne, eshard, e_link)
        ar = ring_time("all_reduce", per_param[1] * ne / eshard, edp // eshard,
                       hw.link(_crosses(edp // eshard, stride * eshard, hw)))
        if layout.stage == 3:
            dp_comm += m * _exposed(2 * ag + rs + ar, slot, unit_frac, overlap)
        else:
            dp_comm += (_exposed(ag, slot / 3, unit_frac, overlap)
                        + _exposed(rs + ar, 2 * slot / 3, unit_frac, overlap))
    elif edp > 1:
        ar = ring_time("all_reduce", per_param[1] * ne, edp, hw.link(_crosses(edp, stride, hw)))
        dp_comm += _exposed(ar, 2 * slot / 3, unit_frac, overlap)
    optimizer += 7 * state_bytes(layout)[0] * ne / eshard / (hw.hbm_gbps * 1e9)
    return StepTime(compute, tensor_parallel, bubble, p2p, dp_comm, optimizer, m * offload_mb, m * a2a_mb)


def _stage_compute(model: ModelShape, layout: Layout, work: Workload, hw: Hardware, stage: int,
                   attention: float) -> tuple[float, float]:
    """``(compute seconds, all-to-all seconds)`` of one micro-batch through pipeline ``stage``, forward
    and backward: its dense and MoE blocks (and the head on the last), with FP8 GEMMs when asked.

    ``attention``: the score and value products' FLOPs per token and layer (causal halving applied)."""
    t, h = layout.mp, model.hidden
    tokens = tokens_per_rank(layout, work)
    layers, n_moe = stage_layer_counts(model, layout, stage)
    n_dense = layers - n_moe
    # Per token: the GEMMs FP8 may take (linear layers) and what stays bf16 (attention, router, head).
    dense_linear = 6 * model.layer_params * tokens / t
    dense_other = attention * tokens / t
    linear, other = n_dense * dense_linear, n_dense * dense_other
    a2a = 0.0
    if n_moe:
        moe = model.moe
        attn_params = model.moe_layer_params - model.router_params - model.shared_expert_params - (
            moe.num_experts * model.expert_params)
        routed = 6 * moe.top_k * model.expert_params * work.load_factor(layout.ep)  # the busiest rank's experts
        linear += n_moe * (6 * attn_params * tokens / t + (6 * model.shared_expert_params + routed) * tokens)
        other += n_moe * (dense_other + 6 * model.router_params * tokens)
        a2a = n_moe * expert_all_to_all_time(model, layout, work, hw)
    if layout.recompute == "full":  # one more forward of the blocks
        linear, other = linear * 4 / 3, other * 4 / 3
    if stage == layout.pp - 1:
        other += 6 * model.vocab * h * tokens / t
    rate = hw.peak_flops * hw.efficiency(h)
    fp8_rate = hw.fp8_peak_flops * hw.efficiency(h) if work.fp8 else rate
    compute = other / rate + linear / fp8_rate
    if a2a and work.a2a_overlap:  # what is hidden behind compute, never more than the compute
        a2a -= min(a2a * work.a2a_overlap, compute)
    return compute, a2a


def remote_nodes_per_token(model: ModelShape, nodes: int) -> float:
    """Expected number of other nodes one token's ``k`` experts lie on, when an ep group spans
    ``nodes`` nodes (experts placed in order, so a node holds ``E / nodes`` consecutive experts).
    Group-limited routing whose groups are the nodes (DeepSeek-V3: 8 groups on 8 nodes) sends a
    token to its ``topk_group`` groups: ``M (G - 1) / G`` of them elsewhere. Otherwise the ``k``
    experts are taken as spread evenly: ``(G - 1) (1 - (1 - 1 / G)^k)``."""
    k = model.moe.top_k
    if model.n_group == nodes and model.topk_group < nodes:
        return model.topk_group * (nodes - 1) / nodes
    return (nodes - 1) * (1 - (1 - 1 / nodes) ** k)


def expert_all_to_all_time(model: ModelShape, layout: Layout, work: Workload, hw: Hardware) -> float:
    """Seconds of one MoE block's all-to-alls per micro-batch on the busiest expert-parallel rank:
    dispatch and combine forward, their gradients backward, the forward pair again with full
    recompute. Each moves the rank's ``k T`` token copies ``h`` wide (the busiest rank receives
    ``moe_load_factor`` times as many); ``(ep - 1) / ep`` of them leave the rank. With the ep group
    inside a node all go over NVLink; across nodes the share bound for other nodes goes over the
    network while the in-node share goes over NVLink. 0 without expert parallelism."""
    ep = layout.ep
    if ep == 1 or model.moe is None:
        return 0.0
    e = 2 if work.amp else 4
    copies = tokens_per_rank(layout, work) * model.moe.top_k * model.hidden * work.moe_load_factor
    stride = layout.cp * layout.mp  # ep ranks are the innermost data ranks: cp x mp apart
    in_node = max(1, min(ep, hw.gpus_per_node // stride))  # ranks of one ep group in a node
    alpha_in, bw_in = hw.link(False)
    alpha_out, bw_out = hw.link(True)

    remote = copies * (ep - in_node) / ep  # copies bound for other nodes
    if in_node < ep and work.moe_dispatch == "node_dedup":
        remote = copies / model.moe.top_k * remote_nodes_per_token(model, ep // in_node)

    def one(elem_bytes: float) -> float:
        local = copies * elem_bytes * (in_node - 1) / ep / bw_in
        if in_node >= ep:
            return alpha_in + local
        return alpha_out + max(local, remote * elem_bytes / bw_out)

    dispatch = one(1 if work.fp8 else e)  # DeepSeek-V3 dispatches FP8 activations, combines bf16
    forward = dispatch + one(e)
    backward = 2 * one(e)
    return forward + backward + (forward if layout.recompute == "full" else 0.0)


def _exposed(comm: float, overlappable: float, unit_frac: float, overlap: bool) -> float:
    """What a collective costs on the critical path when it runs beside ``overlappable`` seconds of
    compute: all of it without overlap; with it, the excess, and at least the last block's share."""
    if not overlap:
        return comm
    return max(comm - overlappable, comm * unit_frac)


def model_flops_per_step(model: ModelShape, work: Workload) -> float:
    """The model FLOPs of one optimizer step (``flops_per_token`` x tokens), what MFU divides."""
    return model.flops_per_token(work.seq_len) * work.tokens

"""Train a tiny MoE decoder for a few AdamW steps under a fleet strategy with expert parallelism;
rank 0 writes the losses, the final parameters and what each rank saw.

    torchrun --nproc_per_node 4 tests/scripts/ep_equivalence.py OUT --dp 4 --ep 2
    python tests/scripts/ep_equivalence.py OUT                          # one process, no fleet

The model (``MoEDecoder``, test-local, built from ``sampan.nn.MoE``) has every balancing feature
on: a "global_batch" aux loss and a z-loss reaching the gradients, and the aux-loss-free bias,
started skewed towards expert 0 so that the bias updates have a visible job (every token picks
expert 0 at first). Every rank builds the same model from the same seed and sees the same global
batches; fleet splits the work.

One process runs the global batch as ``--accumulate`` micro-batches, micro-batch ``i`` made of the
``i``-th micro-batch of every one of ``--data-ranks`` data shards: the batches the fleet run's data
ranks take together, so the "global_batch" aux loss (loads summed over the data ranks) sees the
same tokens both ways.

Before each step the script also measures the expert load of the step's batch (a training-mode
forward without gradients, its loads summed over the data ranks; not with pipelines, which have
no plain forward), for the test that the bias moves towards balance.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

import sampan
from sampan.nn.moe import MoE, moe_blocks, reset_moe_stats, set_aux_loss_scale, update_expert_bias
from sampan.nn.moe_config import MoEConfig

STEPS = 5
VOCAB, HIDDEN, LAYERS, SEQ, BATCH = 64, 32, 4, 16, 8
SKEW = 0.05  # the initial correction bias of expert 0


class Block(torch.nn.Module):
    """A dense MLP (split by tensor parallel) then an MoE block (left whole by it), each residual."""

    def __init__(self, config: MoEConfig):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(HIDDEN)
        self.fc1, self.fc2 = torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.Linear(2 * HIDDEN, HIDDEN)
        self.norm2 = torch.nn.LayerNorm(HIDDEN)
        self.mlp = MoE(config)

    def forward(self, x):
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm1(x))))
        return x + self.mlp(self.norm2(x))


class MoEDecoder(torch.nn.Module):
    """Token tagging (each token's successor) through ``LAYERS`` blocks; brings its own TP plan and
    pipeline split, as a model sampan doesn't know does."""

    TP_PLAN = {"blocks.*.fc1": "colwise", "blocks.*.fc2": "rowwise"}

    def __init__(self, num_experts: int = 8):
        super().__init__()
        config = MoEConfig(hidden_size=HIDDEN, num_experts=num_experts, top_k=2, expert_intermediate_size=16,
                           shared_intermediate_size=16, score_func="sigmoid", score_correction_bias=True,
                           bias_update_rate=0.02, aux_loss="global_batch", aux_loss_coef=0.01, z_loss_coef=1e-3)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.blocks = torch.nn.ModuleList(Block(config) for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB)
        with torch.no_grad():
            for _, block in moe_blocks(self):
                # Experts far from zero: their outputs must weigh in the loss, or a token's result
                # sent to the wrong rank would move it by only ~1e-5.
                block.experts.reset_parameters(std=0.3)
                block.gate.e_score_correction_bias[0] = SKEW

    def forward(self, input_ids, labels=None):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if labels is None:
            return logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)

    def pipeline_parts(self):
        from sampan.models.pipeline_parts import PipelineParts

        return PipelineParts(self.embed, self.blocks, self.norm, self.head, loss="token")


def batches():
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen)
        yield {"input_ids": ids, "labels": torch.roll(ids, -1, dims=1)}


def interleaved(batch: dict, data_ranks: int, accumulate: int) -> list[dict]:
    """The one-process micro-batches matching a fleet run's (see the module docstring)."""
    per_rank = BATCH // data_ranks
    step = per_rank // accumulate
    out = []
    for i in range(accumulate):
        rows = [r * per_rank + i * step + j for r in range(data_ranks) for j in range(step)]
        out.append({k: v[rows] for k, v in batch.items()})
    return out


def imbalance(module, batch, reducer) -> float:
    """The busiest expert's load over the mean, summed over the MoE layers and the data ranks."""
    reset_moe_stats(module)
    with torch.no_grad():
        module(**batch)
    loads = torch.stack([b.tokens_per_expert for _, b in moe_blocks(module)]).sum(0)
    loads = reducer(loads) if reducer is not None else loads
    reset_moe_stats(module)
    return float(loads.max() / loads.mean())


def named_state(dmodel) -> dict[str, torch.Tensor]:
    """This rank's parameters and correction biases as whole tensors, under the model's names."""
    from torch.distributed.tensor import DTensor

    if getattr(dmodel, "_pipeline", None) is not None:
        pairs = [(dmodel.stage_names.param_key(k), p) for k, p in dmodel.stages.named_parameters()]
        pairs += [(dmodel.stage_names.model_key(k), b) for k, b in dmodel.stages.named_buffers()
                  if k.endswith("e_score_correction_bias")]
    else:
        module = getattr(dmodel, "model", dmodel)
        pairs = list(module.named_parameters())
        pairs += [(k, b) for k, b in module.named_buffers() if k.endswith("e_score_correction_bias")]
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in pairs}


def comm_step(dmodel, optimizer, batch) -> tuple[dict, float]:
    """One step with ``CommCounter`` around forward and backward; also the token copies this rank
    routed (all layers) and how many of them went to its own experts."""
    from sampan.distributed.comm_counter import CommCounter

    with CommCounter() as comm:
        loss = dmodel.forward_backward(batch)
    optimizer.step()
    optimizer.clear_grad(set_to_zero=False)
    update_expert_bias(dmodel.model)
    return comm.totals(), loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    for axis in ("dp", "mp", "pp", "sharding", "ep"):
        parser.add_argument(f"--{axis}", type=int, default=1)
    parser.add_argument("--stage", type=int, default=1)
    parser.add_argument("--experts", type=int, default=8, help="routed experts per MoE block")
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--data-ranks", type=int, default=1, help="one process: the data ranks to match")
    parser.add_argument("--recompute", default="none")
    parser.add_argument("--comm", action="store_true", help="count the collectives of the first step")
    parser.add_argument("--save-at", type=int, default=0, help="after this many steps, save to --ckpt (and go on)")
    parser.add_argument("--ckpt", default="")
    parser.add_argument("--resume-from", default="", help="load this checkpoint, then run the remaining steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from sampan.distributed.checkpoint import load_distributed, save_distributed

    torch.manual_seed(0)
    model = MoEDecoder(args.experts)
    # epsilon 1e-5, not 1e-8: AdamW moves a weight whose gradient is ~1e-8 by a whole step of either
    # sign, so summation-order noise there would decide it (1.5e-5 apart after 5 steps, measured).
    optimizer = sampan.optimizer.AdamW(learning_rate=3e-3, parameters=model.parameters(), weight_decay=0.01,
                                       epsilon=1e-5, grad_clip=sampan.nn.ClipGradByGlobalNorm(1.0))
    use_fleet = "RANK" in os.environ
    steps = list(batches())
    losses, imbalances, first, ranks = [], [], 0, None
    if not use_fleet:
        if args.resume_from:
            first = load_distributed(args.resume_from, model, optimizer)["step"]
        set_aux_loss_scale(model, 1.0 / args.accumulate)
        for i, batch in enumerate(steps[first:], start=first):
            imbalances.append(imbalance(model, batch, None))
            micro = interleaved(batch, args.data_ranks, args.accumulate)
            total, count = 0.0, sum(mb["labels"].numel() for mb in micro)
            for mb in micro:
                loss = model(**mb) * (mb["labels"].numel() / count)
                loss.backward()
                total += loss.item()
            optimizer.step()
            optimizer.clear_grad(set_to_zero=False)
            update_expert_bias(model)
            losses.append(total)
            if args.save_at and i + 1 == args.save_at:
                save_distributed(args.ckpt, model, optimizer, extra={"step": i + 1})
        state = named_state(model)
    else:
        from sampan.distributed import fleet

        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {"dp_degree": args.dp, "mp_degree": args.mp, "pp_degree": args.pp,
                                   "sharding_degree": args.sharding, "ep_degree": args.ep}
        strategy.sharding_configs = {"stage": args.stage}
        strategy.pipeline_configs = {"accumulate_steps": args.accumulate}
        strategy.recompute = args.recompute
        fleet.init(is_collective=True, strategy=strategy)
        dmodel = fleet.distributed_model(model, tp_plan=model.TP_PLAN, pipeline_parts=model.pipeline_parts())
        optimizer = fleet.distributed_optimizer(optimizer)
        if args.resume_from:
            first = load_distributed(args.resume_from, dmodel, optimizer)["step"]
        pipeline = dmodel._pipeline is not None
        reducer = None if pipeline else moe_blocks(dmodel.model)[0][1].load_reducer
        comm = None
        for i, batch in enumerate(steps[first:], start=first):
            local = fleet.shard_batch(batch)
            if not pipeline:
                imbalances.append(imbalance(dmodel.model, local, reducer))
            if args.comm and i == first:
                comm, loss = comm_step(dmodel, optimizer, local)
                losses.append(loss)
            else:
                losses.append(dmodel.train_batch(local, optimizer).item())
            if args.save_at and i + 1 == args.save_at:
                save_distributed(args.ckpt, dmodel, optimizer, extra={"step": i + 1})
        state = named_state(dmodel)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, {"losses": losses, "comm": comm, "state": state,
                                          "experts_local_shape": [list(p.to_local().shape) for n, p in
                                                                  (dmodel.model if not pipeline else dmodel.stages)
                                                                  .named_parameters() if n.endswith("gate_up_proj")]})
        if any(g["losses"] != losses for g in gathered):
            raise RuntimeError(f"ranks disagree on the loss: {[g['losses'] for g in gathered]}")
        state = {}
        for g in gathered:
            state.update(g["state"])
        # Every rank holding a correction bias must hold the same one.
        biases = [{k: v.tolist() for k, v in g["state"].items() if k.endswith("e_score_correction_bias")}
                  for g in gathered]
        ranks = [{"comm": g["comm"], "experts_local_shape": g["experts_local_shape"]} for g in gathered]
        for b in biases:
            for k, v in b.items():
                if v != state[k].tolist():
                    raise RuntimeError(f"the ranks' correction biases {k} differ: {v} vs {state[k].tolist()}")
    if not use_fleet or dist.get_rank() == 0:
        torch.save(state, args.out + ".pt")
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "imbalance": imbalances, "ranks": ranks}, f)
    if dist.is_initialized():
        from sampan.distributed.env import shutdown

        shutdown()


if __name__ == "__main__":
    main()

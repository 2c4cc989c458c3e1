"""Train a tiny GPT, ERNIE or Llama-family model for a few AdamW steps under a fleet strategy; rank 0
writes the losses.

    torchrun --nproc_per_node N tests/scripts/fleet_equivalence.py OUT.json --family gpt --dp 2 --mp 1
    python tests/scripts/fleet_equivalence.py OUT.json --family gpt         # one process, no fleet

Every rank builds the same model from the same seed and sees the same global batches; fleet
splits the work. The losses must match the one-process run.

``--optimizer sgd`` trains with plain SGD (no clipping, no weight decay) at a learning rate where
one step visibly moves the loss. AdamW divides the gradient by its own running magnitude, so a
gradient twice or half as large as it should be changes its step by ~1e-7; SGD's step is the
gradient times the learning rate, so a wrong gradient scale shows directly in the next loss.
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

import sampan
from sampan.models import create

STEPS = 5
SGD_LEARNING_RATE = 1.0


class Block(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class UserTagger(torch.nn.Module):
    """A model sampan knows nothing about: it brings its own tensor-parallel plan and pipeline split."""

    TP_PLAN = {"blocks.*.fc1": "colwise", "blocks.*.fc2": "rowwise"}

    def __init__(self, vocab: int = 64, hidden: int = 32, layers: int = 4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.blocks = torch.nn.ModuleList(Block(hidden) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, input_ids, labels=None):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if labels is None:
            return logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)

    def pipeline_parts(self):
        from sampan.distributed.fleet import PipelineParts

        return PipelineParts(self.embed, self.blocks, self.norm, self.head, loss="token")


def make_model(family: str):
    torch.manual_seed(0)
    if family == "custom":
        return UserTagger()
    if family == "gpt":
        return create("gpt-tiny", vocab_size=64, hidden_size=32, num_layers=4, num_heads=4,
                      max_position_embeddings=16)
    if family == "llama":
        # Qwen2.5-0.5B's layout at test size (GQA, q / k / v bias, tied head), plus Qwen3's q / k
        # norm, so one model puts every Llama-family feature under each split.
        return create("qwen2-tiny", vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, num_kv_heads=2,
                      intermediate_size=64, max_position_embeddings=16, qk_norm=True)
    return create("ernie-tiny", vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, intermediate_size=64,
                  max_position_embeddings=16, dropout=0.0, attention_dropout=0.0)


def batches(family: str, global_batch: int = 8, seq: int = 16):
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        ids = torch.randint(1, 64, (global_batch, seq), generator=gen)
        if family in ("gpt", "llama"):
            yield {"input_ids": ids, "labels": ids}
        elif family == "custom":  # tag each token with its successor's id (a token-level loss)
            yield {"input_ids": ids, "labels": torch.roll(ids, -1, dims=1)}
        else:
            masked = torch.rand(global_batch, seq, generator=gen) < 0.3
            masked[:, 0] = True  # every row predicts something, so each shard's loss is defined
            yield {"input_ids": torch.where(masked, torch.full_like(ids, 3), ids),
                   "labels": torch.where(masked, ids, torch.full_like(ids, -100))}


def record_diagnostics(dmodel, optimizer, batch) -> tuple[dict, float]:
    """One training step, recording what this rank sent and held: every collective's calls and
    bytes (``CommCounter``), the norm of each parameter's whole gradient after the backward (under
    the model's own parameter names), the boundary tensors its pipeline stages send on, and the
    dtypes of its parameters, gradients and optimizer state (the sharded ones the optimizer sees)."""
    from torch.distributed.tensor import DTensor

    from sampan.distributed.comm_counter import CommCounter

    with CommCounter() as comm:
        loss = dmodel.forward_backward(batch)
    grad_norms = {}
    if dmodel._pipeline is not None:
        named = [(dmodel.stage_names.param_key(k), p) for k, p in dmodel.stages.named_parameters()]
    else:
        named = list(dmodel.model.named_parameters())
    for name, p in named:
        if p.grad is not None:
            norm = torch.linalg.vector_norm(p.grad.float())
            grad_norms[name] = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    params = [p for g in optimizer.torch_optimizer.param_groups for p in g["params"]]
    local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
    grads = [p.grad for p in params if p.grad is not None]
    optimizer.step()
    optimizer.clear_grad(set_to_zero=False)
    state = [v for s in optimizer.torch_optimizer.state.values() for k, v in s.items()
             if isinstance(v, torch.Tensor) and k != "step"]
    sends = []
    pipeline = dmodel._pipeline
    if pipeline is not None:
        for stage in pipeline.stages:
            if not stage.is_last:
                # torch keeps what a stage sends as TensorMeta (shape, dtype) after the first forward
                sends.append([[*m.shape, str(m.dtype)] for m in stage._stage_meta.outputs])
    from torch.distributed.fsdp import FSDPModule

    held = dmodel.stages if pipeline is not None else dmodel.model
    units = sum(1 for m in held.modules() if isinstance(m, FSDPModule))
    return {"comm": comm.totals(), "boundary_shapes": sends, "grad_norms": grad_norms, "fsdp_units": units,
            "param_dtypes": sorted({str(p.dtype) for p in local}), "param_bytes": sum(p.numel() * p.element_size()
                                                                                     for p in local),
            "grad_dtypes": sorted({str(g.dtype) for g in grads}),
            "state_dtypes": sorted({str(v.dtype) for v in state})}, loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--family", choices=["gpt", "ernie", "llama", "custom"], default="gpt")
    for axis in ("dp", "mp", "pp", "sharding", "cp"):
        parser.add_argument(f"--{axis}", type=int, default=1)
    parser.add_argument("--stage", type=int, default=1)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--schedule", default="1F1B")
    parser.add_argument("--vpp", type=int, default=1)
    parser.add_argument("--sp", action="store_true", help="sequence parallel (with --mp)")
    parser.add_argument("--fleet", action="store_true", help="use fleet even in a single process")
    parser.add_argument("--o2", action="store_true", help="bf16 parameters (amp_configs level O2)")
    parser.add_argument("--no-master-grad", action="store_true", help="O2: reduce gradients in bf16")
    parser.add_argument("--no-master-weight", action="store_true", help="O2: bf16 parameters and optimizer state")
    parser.add_argument("--recompute", default="none")
    parser.add_argument("--offload", action="store_true", help="recomputed blocks keep their inputs on the host")
    parser.add_argument("--diagnostics", action="store_true",
                        help="also record, per rank, what the first step sent and held (see record_diagnostics)")
    parser.add_argument("--save-after", type=int, default=0, help="save a DCP checkpoint here after N steps, stop")
    parser.add_argument("--resume-from", default="", help="load this DCP checkpoint, then run the remaining steps")
    parser.add_argument("--ckpt", default="", help="checkpoint directory for --save-after")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw",
                        help="adamw (clipped at global norm 1) or plain sgd, where gradient scale shows")
    parser.add_argument("--learning-rate", type=float, default=None,
                        help=f"default 1e-2 for adamw, {SGD_LEARNING_RATE} for sgd")
    args = parser.parse_args()
    torch.set_num_threads(1)

    model = make_model(args.family)
    if args.optimizer == "sgd":
        optimizer = sampan.optimizer.SGD(learning_rate=args.learning_rate or SGD_LEARNING_RATE,
                                         parameters=model.parameters())
    else:
        optimizer = sampan.optimizer.AdamW(learning_rate=args.learning_rate or 1e-2, parameters=model.parameters(), weight_decay=0.01,
                                           grad_clip=sampan.nn.ClipGradByGlobalNorm(1.0))
    losses = []
    use_fleet = args.fleet or "RANK" in os.environ
    from sampan.distributed.checkpoint import load_distributed, save_distributed

    steps = list(batches(args.family))
    first = 0
    if args.save_after:
        steps = steps[: args.save_after]
    if not use_fleet:
        if args.resume_from:
            first = load_distributed(args.resume_from, model, optimizer)["step"]
        for batch in steps[first:]:
            loss = model(**batch)
            optimizer.minimize(loss)
            losses.append(loss.item())
        if args.save_after:
            save_distributed(args.ckpt, model, optimizer, extra={"step": args.save_after})
    else:
        from sampan.distributed import fleet

        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {"dp_degree": args.dp, "mp_degree": args.mp, "pp_degree": args.pp,
                                   "sharding_degree": args.sharding, "cp_degree": args.cp}
        if args.o2:
            strategy.amp = "bf16"
            strategy.amp_configs = {"level": "O2", "use_master_grad": not args.no_master_grad,
                                    "use_master_weight": not args.no_master_weight}
        strategy.recompute = args.recompute
        strategy.recompute_configs = {"enable_offload": args.offload}
        strategy.sharding_configs = {"stage": args.stage}
        strategy.pipeline_configs = {"accumulate_steps": args.accumulate, "schedule_mode": args.schedule,
                                     "virtual_pp_degree": args.vpp}
        strategy.tensor_parallel_configs = {"sequence_parallel": args.sp}
        fleet.init(is_collective=True, strategy=strategy)
        own = {"tp_plan": model.TP_PLAN, "pipeline_parts": model.pipeline_parts()} if args.family == "custom" else {}
        dmodel = fleet.distributed_model(model, **own)
        optimizer = fleet.distributed_optimizer(optimizer)
        if args.resume_from:
            first = load_distributed(args.resume_from, dmodel, optimizer)["step"]
        diagnostics = None
        for i, batch in enumerate(steps[first:]):
            if args.diagnostics and i == 0:
                diagnostics, loss = record_diagnostics(dmodel, optimizer, fleet.shard_batch(batch))
                losses.append(loss)
                continue
            losses.append(dmodel.train_batch(fleet.shard_batch(batch), optimizer).item())
        if args.save_after:
            save_distributed(args.ckpt, dmodel, optimizer, extra={"step": args.save_after})
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, losses)
        if any(g != losses for g in gathered):
            raise RuntimeError(f"ranks disagree on the loss: {gathered}")
        if args.diagnostics:
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, diagnostics)
    if not use_fleet or dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, **({"ranks": ranks} if use_fleet and args.diagnostics else {})}, f)
    if dist.is_initialized():
        from sampan.distributed.env import shutdown

        shutdown()


if __name__ == "__main__":
    main()

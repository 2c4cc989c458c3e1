"""Train a tiny GPT with fleet (dp), checkpoint with DCP, survive a killed rank, finish the same.

    sampan launch --nproc_per_node 2 --max_restarts 1 tests/scripts/elastic_train.py OUT --kill-rank 1 --kill-step 8
    sampan launch --nproc_per_node 2 tests/scripts/elastic_train.py OUT            # uninterrupted reference

Every ``--save-every`` steps all ranks write a distributed checkpoint (``torch.distributed.checkpoint``)
of the model and optimizer to ``OUT/ckpt/step_K``, and rank 0 then records K in ``OUT/ckpt/latest.json``.
In the first attempt (``TORCHELASTIC_RESTART_COUNT == 0``) rank ``--kill-rank`` SIGKILLs itself at
the start of step ``--kill-step``; torchrun restarts the group, every rank loads the latest
checkpoint and training goes on from there. Batches depend only on the step number, so a resumed
run sees the same data as an uninterrupted one.

At the end rank 0 writes ``OUT/final.safetensors`` (the full, unsharded parameters) and
``OUT/result.json`` (this attempt's restart count, the step it resumed from, its losses).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

import sampan
from sampan.distributed import fleet
from sampan.distributed.env import shutdown
from sampan.models import create


def batch_for(step: int, global_batch: int = 8, seq: int = 16) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(1, 64, (global_batch, seq), generator=gen)
    return {"input_ids": ids, "labels": ids}


def write_json(path: Path, value) -> None:
    """Atomically: a reader sees the old file or the new one, never half of one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--kill-rank", type=int, default=-1, help="rank that kills itself (-1: none)")
    parser.add_argument("--kill-step", type=int, default=-1, help="step at whose start it does so")
    args = parser.parse_args()
    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    torch.manual_seed(0)
    model = create("gpt-tiny", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                   max_position_embeddings=16)
    optimizer = sampan.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), weight_decay=0.01,
                                       grad_clip=sampan.nn.ClipGradByGlobalNorm(1.0))
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": int(os.environ.get("WORLD_SIZE", "1"))}
    fleet.init(is_collective=True, strategy=strategy)
    dmodel = fleet.distributed_model(model)  # FSDP2 over dp: the parameters are now DTensors
    optimizer = fleet.distributed_optimizer(optimizer)
    torch_opt = optimizer.torch_optimizer
    rank = dist.get_rank()

    ckpt = args.out / "ckpt"
    latest = ckpt / "latest.json"
    start = 0
    if latest.exists():  # a restart: every rank reads the same file, written before the failure
        start = json.loads(latest.read_text())["step"]
        model_sd, optim_sd = get_state_dict(model, torch_opt)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(ckpt / f"step_{start}"))
        set_state_dict(model, torch_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])

    losses = []
    for step in range(start, args.steps):
        if attempt == 0 and rank == args.kill_rank and step == args.kill_step:
            print(f"rank {rank}: killing myself at step {step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        loss = dmodel.train_batch(fleet.shard_batch(batch_for(step)), optimizer)
        losses.append(loss.item())
        done = step + 1
        if done % args.save_every == 0 and done < args.steps:
            model_sd, optim_sd = get_state_dict(model, torch_opt)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(ckpt / f"step_{done}"))
            if rank == 0:  # dcp.save has returned on rank 0: the checkpoint and its metadata are complete
                write_json(latest, {"step": done})
            dist.barrier()  # nobody runs ahead (or dies) before latest.json names this checkpoint

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        save_file({k: v.clone() for k, v in full.items()}, str(args.out / "final.safetensors"))
        write_json(args.out / "result.json", {"attempt": attempt, "resumed_from": start, "losses": losses,
                                              "world_size": dist.get_world_size()})
    shutdown()


if __name__ == "__main__":
    main()

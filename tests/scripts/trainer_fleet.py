"""A tiny GPT trained by the ``Trainer``, with or without a hybrid-parallel strategy.

    python tests/scripts/trainer_fleet.py OUT_DIR --batch 8                                  # one process
    torchrun --nproc_per_node 4 tests/scripts/trainer_fleet.py OUT_DIR --batch 4 \\
        --strategy '{"hybrid_configs": {"dp_degree": 2, "mp_degree": 2}}'

``--batch`` is per data-parallel rank: keep ``batch x dp x sharding`` equal across runs and the
global batches, and so the losses in ``OUT_DIR/metrics.jsonl``, must match the one-process run.

``--kill-rank R --kill-step S`` (under ``sampan launch --max_restarts 1``): in the first attempt,
rank R SIGKILLs itself after step S, as a crashed node would; with ``--resume auto`` the restarted
group resumes from the newest checkpoint. The kill-and-resume test runs with ``--dropout 0.1`` so
every step draws from each rank's torch RNG: a restart that did not restore every rank's stream
would diverge. (Runs compared with one process keep dropout 0: the masks of 1 and N ranks differ.)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import numpy as np
import torch

from sampan.io import TokenWindowDataset
from sampan.models import create
from sampan.trainer import Trainer, TrainerCallback, TrainingArguments


class KillAt(TrainerCallback):
    """SIGKILL this rank after ``step`` in the launcher's first attempt: no cleanup, no flush."""

    def __init__(self, rank: int, step: int):
        self.rank, self.step = rank, step

    def on_step_end(self, args, state):
        first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        if first_attempt and state.global_step == self.step and int(os.environ.get("RANK", "0")) == self.rank:
            print(f"rank {self.rank}: killing myself after step {self.step}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--batch", type=int, default=8, help="per data-parallel rank")
    parser.add_argument("--strategy", default="", help="a DistributedStrategy dict as JSON")
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--save-steps", type=int, default=3)
    parser.add_argument("--resume", default=None, help="a checkpoint directory to resume from, or 'auto'")
    parser.add_argument("--kill-rank", type=int, default=-1)
    parser.add_argument("--kill-step", type=int, default=0)
    parser.add_argument("--dropout", type=float, default=0.0, help="dropout on embeddings, residuals, attention")
    parser.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    args = parser.parse_args()
    torch.set_num_threads(1)

    tokens = np.random.default_rng(0).integers(0, 64, size=4000)
    train = TokenWindowDataset(tokens[:3200], seq_len=16)
    evaluation = TokenWindowDataset(tokens[3200:3969], seq_len=16)  # 48 windows: whole global batches
    torch.manual_seed(0)
    model = create("gpt-tiny", vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, max_position_embeddings=16,
                   dropout=args.dropout, attention_dropout=args.dropout)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=args.batch, gradient_accumulation_steps=2, learning_rate=1e-2,
        lr_scheduler="cosine", warmup_steps=2, weight_decay=0.1, max_grad_norm=0.5, seed=0, logging_steps=1,
        save_steps=args.save_steps, eval_steps=args.save_steps, resume_from_checkpoint=args.resume,
        peak_flops=0, tensorboard=False, progress_bar=False, compile=args.compile,
        strategy=json.loads(args.strategy) if args.strategy else None,
    )
    callbacks = [KillAt(args.kill_rank, args.kill_step)] if args.kill_rank >= 0 else []
    trainer = Trainer(model, training, train, eval_dataset=evaluation, callbacks=callbacks)
    trainer.train()
    if args.compile:  # the run must really have gone through torch.compile, on every rank
        from sampan.nn.compile import is_compiled

        assert is_compiled(trainer.model), "compile=True but no module of the trained model is compiled"
    trainer.save_pretrained(f"{args.output_dir}/model")  # the whole model, whatever the layout
    if trainer.fleet is not None:
        from sampan.distributed.env import shutdown

        shutdown()


if __name__ == "__main__":
    main()

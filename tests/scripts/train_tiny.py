"""A tiny deterministic Trainer run, used by the kill-and-resume test as a real subprocess.

    python tests/scripts/train_tiny.py OUTPUT_DIR [--kill-at STEP] [--workers N] [--resume auto]
                                      [--family gpt|llama] [--recompute none|full|selective]

``--kill-at`` sends SIGKILL to this very process right after that optimizer step, as an
out-of-memory killer or a preempted node would: no cleanup, no flush, no atexit.
"""

from __future__ import annotations

import argparse
import os
import signal

import numpy as np
import torch

from sampan.io import TokenWindowDataset
from sampan.models import create
from sampan.trainer import Trainer, TrainerCallback, TrainingArguments


class KillAt(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--family", choices=["gpt", "llama"], default="gpt")
    parser.add_argument("--recompute", default="none")
    args = parser.parse_args()

    torch.set_num_threads(1)
    tokens = np.random.default_rng(0).integers(0, 97, size=6000)
    dataset = TokenWindowDataset(tokens, seq_len=32)
    torch.manual_seed(0)
    # Dropout makes every step consume the torch RNG, so a resume that restored it wrong would diverge.
    if args.family == "gpt":
        model = create("gpt-tiny", vocab_size=97, hidden_size=32, num_layers=2, num_heads=2,
                       max_position_embeddings=32, dropout=0.1)
    else:  # Qwen2.5's layout at test size; attention dropout is the only dropout the family has
        model = create("qwen2-tiny", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                       intermediate_size=64, max_position_embeddings=32, attention_dropout=0.1)
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, learning_rate=3e-3, lr_scheduler="cosine", warmup_steps=3, weight_decay=0.1,
        seed=0, logging_steps=1, save_steps=4, save_total_limit=2, resume_from_checkpoint=args.resume,
        dataloader_num_workers=args.workers, deterministic=True, peak_flops=0, tensorboard=False,
        progress_bar=False, recompute=args.recompute,
    )
    callbacks = [KillAt(args.kill_at)] if args.kill_at else []
    Trainer(model, training, dataset, callbacks=callbacks).train()


if __name__ == "__main__":
    main()

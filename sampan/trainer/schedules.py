"""Build the learning-rate schedule a ``TrainingArguments`` asks for."""

from __future__ import annotations

import math

from sampan.optimizer.lr import (
    ConstantLR,
    CosineAnnealingDecay,
    LinearDecay,
    LinearWarmup,
    LRScheduler,
    WarmupStableDecay,
)
from sampan.trainer.arguments import TrainingArguments


def build_schedule(args: TrainingArguments, max_steps: int) -> LRScheduler:
    """Warmup then the named decay, ending at ``learning_rate * min_lr_ratio`` on ``max_steps``."""
    lr, warmup = args.learning_rate, args.warmup_for(max_steps)
    min_lr = lr * args.min_lr_ratio
    after = max(1, max_steps - warmup)
    if args.lr_scheduler == "wsd":
        decay = max(1, min(after, math.ceil(args.wsd_decay_ratio * max_steps)))
        return WarmupStableDecay(lr, warmup_steps=warmup, stable_steps=max(0, after - decay), decay_steps=decay,
                                 min_lr=min_lr)
    if args.lr_scheduler == "linear":
        main: LRScheduler | float = LinearDecay(lr, total_steps=after, end_lr=min_lr)
    elif args.lr_scheduler == "cosine":
        main = CosineAnnealingDecay(lr, T_max=after, eta_min=min_lr)
    else:
        main = ConstantLR(lr)
    if warmup == 0:
        return main
    return LinearWarmup(main, warmup_steps=warmup, start_lr=0.0, end_lr=lr)

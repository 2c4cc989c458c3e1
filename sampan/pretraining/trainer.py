"""``PretrainTrainer``: the ``Trainer``, masking each batch at the level its step's stage says."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from sampan.pretraining.batches import MLMBatcher
from sampan.text.masking import MaskingSchedule
from sampan.trainer.trainer import Trainer


class PretrainTrainer(Trainer):
    """Masks the unmasked rows the data loader yields, just before each step uses them.

    Masking happens here, in the training process, and not in the dataset or its workers,
    because the level depends on the global step (the staged schedule). Each micro-batch's
    randomness comes from ``(seed, step, micro-batch)`` alone, so a resumed run masks exactly as
    an uninterrupted one would, whatever the worker count.

    Args:
        batcher: masks a batch and adds labels / attention mask / feature ids.
        masking_schedule: the level per stage of training.
        other arguments: as ``Trainer``.
    """

    def __init__(self, *args: Any, batcher: MLMBatcher, masking_schedule: MaskingSchedule, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.batcher, self.masking_schedule = batcher, masking_schedule
        self.level_log: list[tuple[int, str]] = []  # (first step, level) of each stage, as run

    def _batches(self) -> Iterator[Any]:
        step, micro = -1, 0
        for batch in super()._batches():
            if self.state.global_step != step:
                step, micro = self.state.global_step, 0
            level = self.masking_schedule.level_at(step, self.max_steps)
            if not self.level_log or self.level_log[-1][1] != level:
                self.level_log.append((step, level))
                print(f"masking: step {step}: {level} level")
            rng = np.random.default_rng([self.args.seed, step, micro])
            micro += 1
            yield self.batcher(batch["input_ids"].numpy(), batch["span_flags"].numpy(), level, rng)

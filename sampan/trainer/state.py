"""``TrainerState``: where a run is, saved in every checkpoint."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class TrainerState:
    """Progress counters of a run (plain numbers, so they go into JSON).

    Fields:
        global_step: optimizer steps taken (skipped fp16 / non-finite steps included).
        max_steps: the step the run ends at.
        epoch: fractional epochs of training data consumed.
        tokens_seen: training tokens consumed.
        skipped_steps: steps whose update was skipped (non-finite loss or fp16 overflow).
        consecutive_nonfinite: non-finite losses in a row, for the stop rule.
        train_seconds: wall time spent in training steps, summed across resumes.
    """

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    tokens_seen: int = 0
    skipped_steps: int = 0
    consecutive_nonfinite: int = 0
    train_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerState:
        return cls(**data)

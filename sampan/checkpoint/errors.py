"""The one error type the checkpoint layer raises for a checkpoint that cannot be trusted."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupt or malformed.

    ``problems`` lists each thing found wrong, one sentence each, so a caller (or a person reading
    the log) can tell a half-written save from a flipped bit from a wrong path.
    """

    def __init__(self, path: str | Path, problems: Sequence[str], hint: str = "") -> None:
        self.path = Path(path)
        self.problems = list(problems)
        message = f"checkpoint {self.path} cannot be used: " + "; ".join(self.problems)
        if hint:
            message += f". {hint}"
        super().__init__(message)

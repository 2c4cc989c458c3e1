"""Finding checkpoints in an output directory and deciding which one a run resumes from."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path

from sampan.checkpoint.errors import CheckpointError
from sampan.checkpoint.manifest import verify_checkpoint

CHECKPOINT_PREFIX = "checkpoint-"
_CHECKPOINT_NAME = re.compile(r"checkpoint-(\d+)")

Log = Callable[[str], object]


def checkpoint_dir_name(step: int) -> str:
    """``checkpoint-00000042``: zero-padded so that names sort in step order in a file listing."""
    return f"{CHECKPOINT_PREFIX}{step:08d}"


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """``[(step, path), ...]`` of the ``checkpoint-<step>`` directories in ``output_dir``, oldest first.

    Only names matching ``checkpoint-<digits>`` count; temporary and hidden dirs never do. Whether
    each one is complete is not checked here (see ``verify_checkpoint``). A missing dir gives ``[]``.
    """
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _CHECKPOINT_NAME.fullmatch(entry.name)
        if match and entry.is_dir():
            found.append((int(match.group(1)), entry))
    return sorted(found, key=lambda item: (item[0], item[1].name))


def latest_checkpoint(output_dir: str | Path, log: Log = warnings.warn) -> Path | None:
    """The newest checkpoint in ``output_dir`` that verifies, or None when none does.

    Each newer checkpoint that fails verification is reported through ``log`` (``warnings.warn`` by
    default, or any callable taking a message, e.g. ``logger.warning``), naming the directory and its
    problems, and skipped.
    """
    good, _ = _newest_good(Path(output_dir), log)
    return good


def resolve_resume(
    output_dir: str | Path, resume_from_checkpoint: str | Path | bool | None, log: Log = warnings.warn
) -> Path | None:
    """Turn a ``resume_from_checkpoint`` setting into the checkpoint directory to load, or None.

    - ``None`` / ``False``: start fresh, None.
    - ``"auto"`` (or ``True``): the newest checkpoint in ``output_dir`` that verifies, skipping (and
      logging) bad newer ones; None when ``output_dir`` holds no checkpoint at all. If checkpoints
      exist but none verifies, raises rather than silently restarting from step 0 beside them.
    - a path: that checkpoint, which must verify.

    Raises:
        CheckpointError: the named checkpoint (or, for "auto", every checkpoint) fails verification.
        TypeError: ``resume_from_checkpoint`` is of another type.
    """
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True or resume_from_checkpoint == "auto":
        good, rejected = _newest_good(Path(output_dir), log)
        if good is None and rejected:
            problems = [f"{path.name}: {'; '.join(found)}" for path, found in rejected]
            raise CheckpointError(
                output_dir,
                problems,
                "No checkpoint there verifies. Repair or move the bad ones away, or set "
                "resume_from_checkpoint=None to start from scratch",
            )
        return good
    if not isinstance(resume_from_checkpoint, (str, Path)):
        raise TypeError(
            "resume_from_checkpoint must be None, False, True, 'auto' or a checkpoint path, "
            f"got {type(resume_from_checkpoint).__name__}"
        )
    path = Path(resume_from_checkpoint)
    problems = verify_checkpoint(path)
    if problems:
        hint = ""
        if list_checkpoints(path):
            hint = "It is an output directory: pass one of its checkpoint-* directories, or 'auto'"
        raise CheckpointError(path, problems, hint)
    return path


def _newest_good(output_dir: Path, log: Log) -> tuple[Path | None, list[tuple[Path, list[str]]]]:
    rejected: list[tuple[Path, list[str]]] = []
    for _, path in reversed(list_checkpoints(output_dir)):
        problems = verify_checkpoint(path)
        if not problems:
            return path, rejected
        rejected.append((path, problems))
        log(f"skipping checkpoint {path}: {'; '.join(problems)}")
    return None, rejected

"""Checkpoints a Trainer resumes from bit-exactly after a SIGKILL, with nothing unpickled.

A checkpoint is a directory of safetensors + JSON files with a manifest of sha256 checksums,
written atomically (temp dir + fsync + rename). Any nested training state (model and optimizer
state dicts, RNG states, data position, scheduler, args) is split by ``flatten_state`` into
tensors and a JSON skeleton and rebuilt exactly by ``unflatten_state``.

    path = save_checkpoint(out, step, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                       "trainer_state": {"step": step, "rng": capture_rng_state()}},
                           save_total_limit=3)
    resume = resolve_resume(out, "auto")          # newest checkpoint that verifies, or None
    if resume is not None:
        state = load_checkpoint(resume)
        model.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"])
        restore_rng_state(state["trainer_state"]["rng"])
"""

from sampan.checkpoint.discovery import latest_checkpoint, list_checkpoints, resolve_resume
from sampan.checkpoint.errors import CheckpointError
from sampan.checkpoint.manifest import verify_checkpoint
from sampan.checkpoint.rng import capture_rng_state, restore_rng_state
from sampan.checkpoint.state_codec import flatten_state, unflatten_state
from sampan.checkpoint.store import load_checkpoint, save_checkpoint

__all__ = [
    "CheckpointError",
    "capture_rng_state",
    "flatten_state",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "resolve_resume",
    "restore_rng_state",
    "save_checkpoint",
    "unflatten_state",
    "verify_checkpoint",
]

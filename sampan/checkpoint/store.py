"""Saving checkpoints atomically and loading them back without unpickling anything.

Layout of ``output_dir/checkpoint-00000042/``::

    model.safetensors  model.json         one pair per component: tensors + JSON skeleton
    optimizer.safetensors  optimizer.json
    trainer_state.safetensors  trainer_state.json
    <extra files>                          e.g. config.json, as given
    manifest.json                          sha256 + size of every file above; written last

A SIGKILL at any instant leaves either the previous set of checkpoints or the new one, never a
half-written ``checkpoint-*`` dir: everything is written and fsynced inside a hidden
``.tmp-checkpoint-*`` sibling, which is renamed into place only when complete.
"""

from __future__ import annotations

import os  # noqa: F401  # tests fail a save by patching store.os.rename, the os.rename atomic_dir calls
import re
import shutil
import uuid
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from sampan.checkpoint.discovery import checkpoint_dir_name, list_checkpoints
from sampan.checkpoint.errors import CheckpointError
from sampan.checkpoint.files import is_safe_name, json_bytes, load_json, sync_and_hash, write_synced
from sampan.checkpoint.manifest import (
    MANIFEST_NAME,
    TENSOR_SUFFIX,
    build_manifest,
    check_checkpoint,
    component_files,
    read_manifest,
)
from sampan.checkpoint.state_codec import flatten_state, unflatten_state
from sampan.utils.atomic import atomic_dir, move_into_place, remove_dir

TMP_PREFIX = ".tmp-checkpoint-"
# Where an existing checkpoint for the same step waits while the new one is renamed over it.
_REPLACED = re.compile(r"\.replaced-(checkpoint-\d+)-[0-9a-f]{8}")


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    components: Mapping[str, Any],
    save_total_limit: int | None = None,
    extra_files: Mapping[str, bytes] | None = None,
) -> Path:
    """Write ``output_dir/checkpoint-{step:08d}/`` atomically and return its path.

    Args:
        output_dir: created if missing. One writer at a time: a save sweeps up the ``.tmp-checkpoint-*``
            dirs it finds, taking them for leftovers of a crashed save.
        step: the global step (int >= 0); a checkpoint already there for this step is replaced.
        components: name -> state, each stored as ``{name}.safetensors`` + ``{name}.json`` (see
            ``flatten_state`` for what a state may hold), e.g. ``{"model": model.state_dict(),
            "optimizer": opt.state_dict(), "trainer_state": {"step": ..., "rng": capture_rng_state()}}``.
        save_total_limit: keep at most this many checkpoints, deleting the lowest steps first but
            never the one just written. None keeps all.
        extra_files: file name -> bytes written beside the components (a config, a tokenizer), also
            covered by the manifest.

    Raises:
        TypeError: a component holds a value ``flatten_state`` cannot store (the message names its path).
        ValueError: a bad step, limit, or component / file name.
    """
    if type(step) is not int or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if save_total_limit is not None and (type(save_total_limit) is not int or save_total_limit < 1):
        raise ValueError(f"save_total_limit must be None or an int >= 1, got {save_total_limit!r}")
    extra = {name: bytes(data) for name, data in (extra_files or {}).items()}
    _check_names(list(components), list(extra))

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    _sweep_stale(out)
    final = out / checkpoint_dir_name(step)
    # The temporary dir's prefix and the aside name are ones _sweep_stale knows: a save killed midway
    # is swept up by the next one, and an old checkpoint of the same step left aside is put back.
    aside = out / f".replaced-{final.name}-{uuid.uuid4().hex[:8]}"
    with atomic_dir(final, prefix=f"{TMP_PREFIX}{step:08d}-", aside=aside) as tmp:
        files: dict[str, dict[str, Any]] = {}
        # One component at a time, so only one component's CPU copies are in memory at once.
        for name, state in components.items():
            tensor_file, skeleton_file = component_files(name)
            tensors, skeleton = flatten_state(state, root=name)
            # "pt" lets other safetensors tools (e.g. transformers) open the file.
            save_file(tensors, tmp / tensor_file, metadata={"format": "pt"})
            del tensors
            files[tensor_file] = sync_and_hash(tmp / tensor_file)
            write_synced(tmp / skeleton_file, json_bytes(skeleton))
            files[skeleton_file] = sync_and_hash(tmp / skeleton_file)
        for name, data in extra.items():
            write_synced(tmp / name, data)
            files[name] = sync_and_hash(tmp / name)
        # The manifest goes last: a directory holding one finished its save.
        write_synced(tmp / MANIFEST_NAME, json_bytes(build_manifest(step, list(components), files)))
    if save_total_limit is not None:
        rotate_checkpoints(out, save_total_limit, keep=final)
    return final


def load_checkpoint(
    path: str | Path, verify: bool = True, components: Iterable[str] | None = None
) -> dict[str, Any]:
    """Load a checkpoint's components: ``{name: state}``, tensors on the CPU.

    Reads only safetensors and JSON; nothing is unpickled. With ``verify`` the manifest and the
    sha256 of each file read are checked first (``verify=False`` skips the hashing, e.g. right after
    ``resolve_resume`` verified the same dir; a missing manifest is then tolerated and the components
    are found from the ``*.safetensors`` / ``*.json`` pairs). ``components`` loads only those names.

    Raises:
        CheckpointError: verification failed, a component is absent, or a file is malformed.
    """
    path = Path(path)
    manifest, problems = read_manifest(path)
    if manifest is not None:
        available = list(manifest["components"])
    elif verify:
        raise CheckpointError(path, problems)
    else:
        available = sorted(p.name.removesuffix(TENSOR_SUFFIX) for p in path.glob(f"*{TENSOR_SUFFIX}"))
    names = available if components is None else list(components)
    absent = [name for name in names if name not in available]
    if absent:
        raise CheckpointError(
            path, [f"it has no component {name!r}" for name in absent], f"It holds {available}"
        )
    if verify:
        problems = check_checkpoint(path, only={f for name in names for f in component_files(name)})
        if problems:
            raise CheckpointError(path, problems)
    return {name: _load_component(path, name) for name in names}


def _load_component(path: Path, name: str) -> Any:
    tensor_file, skeleton_file = component_files(name)
    try:
        tensors = load_file(path / tensor_file, device="cpu")
        skeleton = load_json(path / skeleton_file)
        return unflatten_state(tensors, skeleton)
    except (OSError, ValueError) as error:
        raise CheckpointError(path, [f"component {name!r} cannot be read: {error}"]) from error
    except Exception as error:  # safetensors raises its own SafetensorError for a malformed file
        raise CheckpointError(path, [f"{tensor_file} is not a valid safetensors file: {error}"]) from error


def _check_names(components: list[str], extra: list[str]) -> None:
    if not components:
        raise ValueError("components is empty: nothing to checkpoint")
    taken = {MANIFEST_NAME}
    for kind, names in (("component", components), ("extra file", extra)):
        for name in names:
            if not is_safe_name(name):
                raise ValueError(
                    f"{kind} name {name!r} is not a plain file name (letters, digits, '_', '.', '-'; "
                    "not starting with '.')"
                )
            files = component_files(name) if kind == "component" else (name,)
            clash = taken.intersection(files)
            if clash:
                raise ValueError(
                    f"{kind} {name!r} would write {sorted(clash)}, which another entry already uses"
                )
            taken.update(files)


def _sweep_stale(out: Path) -> None:
    """Remove what a crashed save or deletion left behind; restore a checkpoint that a kill between
    atomic_dir's two renames left set aside."""
    for entry in out.iterdir():
        if entry.name.startswith(TMP_PREFIX) and entry.is_dir():
            shutil.rmtree(entry)
            continue
        match = _REPLACED.fullmatch(entry.name)
        if match and entry.is_dir():
            original = out / match.group(1)
            if original.exists():
                shutil.rmtree(entry)
            else:
                move_into_place(entry, original)


def rotate_checkpoints(out: Path, limit: int, keep: Path) -> None:
    """Delete the oldest ``checkpoint-*`` dirs in ``out`` beyond ``limit``, never ``keep``."""
    checkpoints = list_checkpoints(out)
    excess = len(checkpoints) - limit
    oldest_first = [path for _, path in checkpoints if path != keep]
    for path in oldest_first[: max(excess, 0)]:
        try:
            remove_dir(path, f"{TMP_PREFIX}deleting-")
        except OSError as error:
            # The new checkpoint is safe; failing the save (and the run) over an old one would lose more.
            warnings.warn(
                f"could not delete old checkpoint {path} (save_total_limit={limit}): {error}", stacklevel=3
            )

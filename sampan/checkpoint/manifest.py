"""The checkpoint manifest (written last, so its presence means the save finished) and verification."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import torch

from sampan.checkpoint.files import hash_file, is_safe_name, load_json

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "sampan-checkpoint"
MANIFEST_VERSION = 1
TENSOR_SUFFIX = ".safetensors"
SKELETON_SUFFIX = ".json"
_SHA256 = re.compile(r"[0-9a-f]{64}")
# torch DCP's index of a distributed checkpoint's shards: the one hidden name a manifest may list.
DCP_METADATA = ".metadata"


def component_files(name: str) -> tuple[str, str]:
    """The tensor file and skeleton file that hold component ``name``."""
    return name + TENSOR_SUFFIX, name + SKELETON_SUFFIX


def build_manifest(step: int, components: list[str], files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "step": step,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "components": components,
        "files": files,
        "torch": torch.__version__,  # for forensics only; nothing depends on it
    }


def read_manifest(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """``(manifest, [])`` for a well-formed manifest, else ``(None, problems)``."""
    if not path.is_dir():
        return None, [f"{path} does not exist" if not path.exists() else f"{path} is not a directory"]
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.is_file():
        return None, [f"{MANIFEST_NAME} is missing (the save did not finish, or the file was deleted)"]
    try:
        manifest = load_json(manifest_path)
    except ValueError as error:
        return None, [f"{MANIFEST_NAME} is not valid JSON: {error}"]
    problems = _manifest_problems(manifest)
    return (None, problems) if problems else (manifest, [])


def _manifest_problems(manifest: Any) -> list[str]:
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        return [f"{MANIFEST_NAME} is not a {MANIFEST_FORMAT} manifest"]
    version = manifest.get("version")
    if type(version) is not int or version > MANIFEST_VERSION:
        return [
            f"{MANIFEST_NAME} has version {version!r}; this sampan reads up to {MANIFEST_VERSION} (upgrade sampan)"
        ]
    problems = []
    if type(manifest.get("step")) is not int:
        problems.append(f"{MANIFEST_NAME} has no integer 'step'")
    files = manifest.get("files")
    if not isinstance(files, dict):
        return [*problems, f"{MANIFEST_NAME} has no 'files' table"]
    for name, record in files.items():
        if not (is_safe_name(name) or name == DCP_METADATA):
            problems.append(f"{MANIFEST_NAME} lists an unsafe file name {name!r}")
        elif not (
            isinstance(record, dict)
            and isinstance(record.get("sha256"), str)
            and _SHA256.fullmatch(record["sha256"])
            and type(record.get("bytes")) is int
        ):
            problems.append(f"{MANIFEST_NAME} entry for {name} lacks a sha256 hex digest or a byte count")
    components = manifest.get("components")
    if not isinstance(components, list) or not all(isinstance(c, str) for c in components):
        return [*problems, f"{MANIFEST_NAME} has no 'components' list"]
    for component in components:
        for filename in component_files(component):
            if filename not in files:
                problems.append(f"{MANIFEST_NAME} lists component {component!r} but not its file {filename}")
    return problems


def verify_checkpoint(path: str | Path) -> list[str]:
    """Everything wrong with the checkpoint directory ``path``; an empty list means it is good.

    Checks that ``manifest.json`` exists and is well formed, and that every file it lists exists with
    the recorded size and sha256 and, for ``.json`` files, parses as JSON. Files not in the manifest
    are ignored. Reads every byte, so it costs one pass over the checkpoint.
    """
    return check_checkpoint(Path(path))


def check_checkpoint(path: Path, only: set[str] | None = None) -> list[str]:
    """``verify_checkpoint``, restricted to the files in ``only`` when given (the manifest is always checked)."""
    manifest, problems = read_manifest(path)
    if manifest is None:
        return problems
    for name, record in manifest["files"].items():
        if only is None or name in only:
            problems.extend(_file_problems(path / name, record))
    return problems


def _file_problems(file: Path, record: dict[str, Any]) -> list[str]:
    if not file.is_file():
        return [f"{file.name} is missing"]
    actual = hash_file(file)
    if actual["bytes"] != record["bytes"]:
        return [f"{file.name} has {actual['bytes']} bytes, the manifest says {record['bytes']}"]
    if actual["sha256"] != record["sha256"]:
        return [
            f"{file.name} is corrupt: sha256 {actual['sha256'][:12]}... differs from the manifest's {record['sha256'][:12]}..."
        ]
    if file.suffix == ".json":
        try:
            load_json(file)
        except ValueError as error:
            return [f"{file.name} is not valid JSON: {error}"]
    return []

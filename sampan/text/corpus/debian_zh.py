"""``debian-zh``: modern Simplified-Chinese prose from Debian's documentation packages, fetched once.

``sampan data fetch debian-zh`` downloads each package with ``apt-get download`` (no install),
reads its HTML / XHP / DocBook / man pages / text files straight out of the .deb (``sampan.text.corpus.deb``),
keeps the Han-majority paragraphs (``sampan.text.corpus.zh_prose``), drops repeats and boilerplate
across the whole corpus, and writes ``documents.jsonl`` + ``manifest.json`` (package versions,
.deb SHA-256, licences, files read, what was kept) + each package's ``copyright`` file under
``$SAMPAN_HOME/corpora/debian-zh/``, atomically. A machine without apt (or without network) can
pass a directory of .debs fetched elsewhere (``--deb-dir``).

Every document is one file of a package (a fortune file: one entry), its id
``debian-zh/<package>/<path inside the package>`` (``#<n>`` for a fortune entry), its text the
kept paragraphs joined by newlines. ``fortunes-zh`` (classical quotations and Tang / Song poems)
is tagged ``register: classical`` and served as the separate corpus ``debian-zh-classical``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Literal

from sampan.text.corpus.deb import DebFile, apt_download, check_package_name, find_deb, read_deb
from sampan.text.corpus.document import Document
from sampan.text.corpus.zh_prose import (
    ProseFilter,
    fortune_entries,
    han_count,
    han_skeleton,
    markup_paragraphs,
    read_man,
    text_paragraphs,
)
from sampan.utils.atomic import atomic_dir

CORPUS = "debian-zh"
DOCUMENTS_FILE = "documents.jsonl"
FORMAT = 1
Register = Literal["modern", "classical"]


@dataclasses.dataclass(frozen=True)
class DebSource:
    """A Debian package the corpus reads, and which of its files hold its Chinese text.

    Fields:
        name: the package name.
        include: a regular expression (``re.fullmatch``) on paths inside the package; only those
            files are read.
        register: "modern" prose, or "classical" (served apart, as ``debian-zh-classical``).
    """

    name: str
    include: str
    register: Register = "modern"


_READABLE = r".*\.(?:html?|xhtml|xhp|xml|dbk|txt)(?:\.gz)?|usr/share/man/[^/]+/man\d\w*/.*"
# The packages of issue 39, in the order that decides which copy of a repeated paragraph is kept
# (modern prose first, the fortunes, which quote the Debian reference, last). Checked in Debian 12.
# Not here: linuxcnc-doc-zh-cn (2.9.0~pre1), whose zh_CN PDFs (1,336 pages) and HTML page hold no
# Chinese at all (untranslated).
PACKAGES: tuple[DebSource, ...] = (
    DebSource("debian-reference-zh-cn", r"usr/share/debian-reference/.*\.html"),
    DebSource("debian-edu-doc-zh-cn", r"usr/share/doc/debian-edu-doc-zh-cn/.*\.html"),
    DebSource("libreoffice-help-zh-cn", r"usr/share/libreoffice/help/zh-CN/.*\.(?:html|xhp)"),
    DebSource("gimp-help-zh-cn", r"usr/share/gimp/2\.0/help/zh_CN/.*\.html"),
    DebSource("kicad-doc-zh", r"usr/share/doc/kicad/help/zh/.*\.html"),
    DebSource("lilypond-doc-html-zh", r"usr/share/doc/lilypond/html/.*\.zh\.html"),
    # zh_CN only: its zh_TW pages are the same translations in traditional characters.
    DebSource("manpages-zh", r"usr/share/man/zh_CN/man\d\w*/.*"),
    DebSource("fortunes-zh", r"usr/share/games/fortunes/(?:chinese|tang300|song100)", "classical"),
)
KNOWN = {p.name: p for p in PACKAGES}


def source_for(name: str) -> DebSource:
    """The known ``DebSource`` of package ``name``, or for any other package one that reads all its
    HTML / XHP / DocBook / man / text files except traditional-Chinese (zh_TW / zh_HK) ones."""
    check_package_name(name)
    return KNOWN.get(name) or DebSource(name, _READABLE)


@dataclasses.dataclass
class DebianZhConfig:
    """What ``fetch_debian_zh`` reads and how it filters.

    Fields:
        packages: the Debian packages to read (default: all of ``PACKAGES``); others are read with
            a generic rule (``source_for``).
        deb_dir: read ``NAME_*.deb`` files from this directory instead of running ``apt-get
            download`` (for a machine without apt or network).
        force: fetch again even when the corpus is there.
        min_han: a paragraph needs at least this many Han characters (``ProseFilter.min_han``).
        min_han_ratio: and at least this Han share (``zh_prose.han_share``: Han characters among
            its non-space characters, a run of ASCII counting as one).
        min_sentence_han: a shorter paragraph is still kept when it is one whole sentence (ends
            in 。！？) with at least this many Han characters; 0 turns that off.
        boilerplate_docs: a paragraph (by its Han characters alone) found in at least this many
            documents is page furniture (a "see also" line, a licence footer), dropped everywhere.
    """

    packages: tuple[str, ...] = tuple(p.name for p in PACKAGES)
    deb_dir: str | None = None
    force: bool = False
    min_han: int = 20
    min_han_ratio: float = 0.6
    min_sentence_han: int = 10
    boilerplate_docs: int = 10

    def __post_init__(self) -> None:
        if isinstance(self.packages, str):
            self.packages = tuple(p.strip() for p in self.packages.split(",") if p.strip())
        self.packages = tuple(dict.fromkeys(self.packages))
        if not self.packages:
            raise ValueError(f"packages must name at least one Debian package, e.g. {PACKAGES[0].name}")
        for name in self.packages:
            check_package_name(name)
        if self.boilerplate_docs < 2:
            raise ValueError(f"boilerplate_docs must be >= 2 (a paragraph in one document is not repeated), "
                             f"got {self.boilerplate_docs}")
        self.prose_filter()  # validates the thresholds

    def thresholds(self) -> dict[str, int | float]:
        """The extraction thresholds, as the manifest records them."""
        return {"min_han": self.min_han, "min_han_ratio": self.min_han_ratio,
                "min_sentence_han": self.min_sentence_han, "boilerplate_docs": self.boilerplate_docs}

    def prose_filter(self) -> ProseFilter:
        """The paragraph filter these thresholds make."""
        return ProseFilter(self.min_han, self.min_han_ratio, self.min_sentence_han)


def debian_zh_dir() -> Path:
    """Where the fetched corpus lives: ``$SAMPAN_HOME/corpora/debian-zh``."""
    from sampan.utils.paths import home

    return home() / "corpora" / CORPUS


def fetch_debian_zh(config: DebianZhConfig | None = None, log: Callable[[str], None] = print) -> Path:
    """Download, read, filter, deduplicate and store the packages of ``config``; returns the directory.

    Nothing is done when every requested package is already there under the same thresholds
    (unless ``config.force``); a request naming a package not there yet, or other thresholds,
    rebuilds the corpus from the packages requested and those already there, so nothing fetched
    before is lost. The directory appears complete or not at all.
    """
    config = config or DebianZhConfig()
    target = debian_zh_dir()
    manifest_path = target / "manifest.json"
    present: list[str] = []
    if manifest_path.is_file() and (target / DOCUMENTS_FILE).is_file():
        old = json.loads(manifest_path.read_text(encoding="utf-8"))
        present = list(old["packages"])
        same = old.get("format") == FORMAT and old.get("thresholds") == config.thresholds()
        if not config.force and same and set(config.packages) <= set(present):
            log(f"debian-zh: already fetched ({target}: {', '.join(present)}); --force fetches again")
            return target
    order = {p.name: i for i, p in enumerate(PACKAGES)}
    names = sorted(set(config.packages) | set(present if not config.force else ()),
                   key=lambda n: (order.get(n, len(order)), n))
    if present and not config.force:
        log(f"debian-zh: rebuilding with {', '.join(names)} (the packages already there stay)")
    target.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".debian-zh-", dir=target.parent) as tmp:
        os.chmod(tmp, 0o755)  # apt-get download runs its fetcher as user _apt, which must write here
        read = [_read_package(source_for(name), Path(tmp), config, log) for name in names]
        documents, stats = _deduplicate(read, config.boilerplate_docs)
        with atomic_dir(target) as work:
            with (work / DOCUMENTS_FILE).open("w", encoding="utf-8") as out:
                for doc in documents:
                    out.write(json.dumps(doc, ensure_ascii=False) + "\n")
            (work / "licenses").mkdir()
            packages = {}
            for package in read:
                copyright_file = None
                if package.copyright:
                    copyright_file = f"licenses/{package.deb.package}.copyright"
                    (work / copyright_file).write_text(package.copyright, encoding="utf-8")
                packages[package.source.name] = {
                    "version": package.deb.version, "deb": package.deb.path.name, "sha256": package.deb.sha256,
                    "register": package.source.register, "include": package.source.include,
                    "licenses": package.licenses, "copyright": copyright_file,
                    "files_read": len(package.files), **stats[package.source.name], "files": package.files,
                }
            manifest = {
                "corpus": CORPUS, "format": FORMAT,
                "source": f".debs in {config.deb_dir}" if config.deb_dir else "`apt-get download` (Debian packages)",
                "thresholds": config.thresholds(),
                "totals": {key: sum(p[key] for p in packages.values())
                           for key in ("documents", "paragraphs", "han", "characters")},
                "packages": packages,
            }
            (work / "manifest.json").write_text(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n",
                                                encoding="utf-8")
    totals = manifest["totals"]
    log(f"debian-zh: {totals['documents']:,} documents, {totals['paragraphs']:,} paragraphs, "
        f"{totals['han']:,} Han characters -> {target} ({time.perf_counter() - start:.0f} s)")
    return target


@dataclasses.dataclass
class _Package:
    source: DebSource
    deb: DebFile
    files: list[str]
    # (document id, path, paragraphs that passed the filter), in reading order
    documents: list[tuple[str, str, list[str]]]
    paragraphs_seen: int
    licenses: list[str]
    copyright: str | None


def _read_package(source: DebSource, tmp: Path, config: DebianZhConfig, log: Callable[[str], None]) -> _Package:
    start = time.perf_counter()
    if config.deb_dir:
        path = find_deb(source.name, Path(config.deb_dir))
    else:
        log(f"debian-zh: {source.name}: apt-get download")
        path = apt_download(source.name, tmp)
    deb, files = read_deb(path)
    if deb.package != source.name:
        raise ValueError(f"{path} holds package {deb.package!r}, not {source.name!r}")
    include = re.compile(source.include)
    doc_dir = f"usr/share/doc/{source.name}"
    copyright_path = f"{doc_dir}/copyright"
    prose = config.prose_filter()
    by_file: dict[str, list[tuple[str, list[str]]]] = {}
    copyright_text = None
    for name, data in files(lambda n: n in (doc_dir, copyright_path) or (include.fullmatch(n) is not None
                                                                        and not _TRADITIONAL.search(n))):
        if isinstance(data, str):  # a link: read its target's file instead, if in the package
            if name == doc_dir:
                # Debian lets a package's doc directory link to one of its dependencies' (gimp-help-zh-cn
                # -> gimp-help-common): the copyright file is in that package.
                copyright_text = copyright_text or (f"{source.name}: /{doc_dir} links to {data}; the copyright "
                                                    f"file is /usr/share/doc/{data}/copyright in package {data}\n")
            continue
        if name == copyright_path:
            copyright_text = data.decode("utf-8", errors="replace")
            continue
        parts = _file_documents(name, data)
        if parts is not None:
            by_file[name] = parts
    # Path order, not the archive's: which copy of a repeated paragraph is kept must not depend
    # on how the package was built.
    read = sorted(by_file)
    documents: list[tuple[str, str, list[str]]] = []
    seen = 0
    for name in read:
        for suffix, paragraphs in by_file[name]:
            seen += len(paragraphs)
            kept = [p for p in paragraphs if prose.keep(p)]
            if kept:
                documents.append((f"{CORPUS}/{source.name}/{name}{suffix}", name, kept))
    if not read:
        raise ValueError(f"{source.name} {deb.version}: no file matches {source.include!r}; the package's layout "
                         "changed, update its DebSource in sampan/text/corpus/debian_zh.py")
    han = sum(han_count(p) for _, _, ps in documents for p in ps)
    log(f"debian-zh: {source.name} {deb.version}: {len(read)} files, {seen:,} paragraphs, "
        f"{sum(len(ps) for _, _, ps in documents):,} kept ({han:,} Han) in {time.perf_counter() - start:.1f} s")
    return _Package(source, deb, read, documents, seen, _licenses(copyright_text), copyright_text)


_TRADITIONAL = re.compile(r"zh[_-](?:TW|HK|Hant)", re.IGNORECASE)


def _file_documents(name: str, data: bytes) -> list[tuple[str, list[str]]] | None:
    """The documents of one file as ``(id suffix, paragraphs)``, or None for a kind not read."""
    import gzip

    inner = name[:-3] if name.endswith(".gz") else name
    if re.search(r"/man\d\w*/", name):
        return [("", read_man(data))]
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    lower = inner.lower()
    if "/games/fortunes/" in name:
        entries = fortune_entries(data.decode("utf-8", errors="replace"))
        return [(f"#{i}", [e]) for i, e in enumerate(entries, 1)]
    if lower.endswith((".html", ".htm", ".xhtml")):
        return [("", markup_paragraphs(data.decode("utf-8", errors="replace")))]
    if lower.endswith((".xhp", ".xml", ".dbk")):
        return [("", markup_paragraphs(data.decode("utf-8", errors="replace"), xml=True))]
    if lower.endswith(".txt"):
        return [("", text_paragraphs(data.decode("utf-8", errors="replace")))]
    return None


def _licenses(copyright_text: str | None) -> list[str]:
    """The licence names a machine-readable (DEP-5) copyright file declares, or a note that it is free-form."""
    if not copyright_text:
        return []
    names = re.findall(r"(?m)^License:[ \t]*(\S.*?)\s*$", copyright_text)
    if names:
        return sorted(set(names))
    link = re.search(r"links to (\S+);", copyright_text)
    return [f"see package {link.group(1)}'s copyright file"] if link else ["see licenses/ (free-form copyright file)"]


def _deduplicate(packages: list[_Package], boilerplate_docs: int) -> tuple[list[dict], dict[str, dict]]:
    """Drop paragraphs repeated anywhere before (same Han characters, in package then path order) and
    those found in ``boilerplate_docs`` or more documents (all copies); returns the JSONL rows and
    per-package counts."""
    in_docs: Counter[str] = Counter()
    for package in packages:
        for _, _, paragraphs in package.documents:
            in_docs.update({han_skeleton(p) for p in paragraphs})
    seen: set[str] = set()
    rows: list[dict] = []
    stats: dict[str, dict] = {}
    for package in packages:
        count = Counter(paragraphs_seen=package.paragraphs_seen)
        for doc_id, path, paragraphs in package.documents:
            kept = []
            for paragraph in paragraphs:
                key = han_skeleton(paragraph)
                if in_docs[key] >= boilerplate_docs:
                    count["boilerplate_dropped"] += 1
                elif key in seen:
                    count["duplicates_dropped"] += 1
                else:
                    seen.add(key)
                    kept.append(paragraph)
            if kept:
                rows.append({"id": doc_id, "package": package.source.name, "path": path,
                             "register": package.source.register, "paragraphs": kept})
                count["documents"] += 1
                count["paragraphs"] += len(kept)
                count["han"] += sum(han_count(p) for p in kept)
                count["characters"] += sum(len(p) for p in kept)
        stats[package.source.name] = {key: count[key] for key in (
            "paragraphs_seen", "duplicates_dropped", "boilerplate_dropped", "documents", "paragraphs", "han",
            "characters")}
    return rows, stats


# ---------------------------------------------------------------------------------------------
# Loading


def fetched_documents_file() -> Path:
    """The fetched documents file, or ``FileNotFoundError`` naming the command that fetches it."""
    path = debian_zh_dir() / DOCUMENTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"the debian-zh corpus is not fetched yet: run `sampan data fetch debian-zh` first "
                                f"(apt-get downloads {len(PACKAGES)} Debian documentation packages, ~90 MB, "
                                f"once, into {debian_zh_dir()})")
    return path


@lru_cache(maxsize=2)
def _rows(path: str, mtime: float, register: str) -> tuple[tuple[str, str], ...]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["register"] == register:
                rows.append((row["id"], "\n".join(row["paragraphs"])))
    return tuple(rows)


def debian_zh_documents(register: Register = "modern") -> list[Document]:
    """The fetched corpus's documents of ``register`` ("modern": the documentation; "classical": the
    fortunes), one per package file, ids ``debian-zh/<package>/<path>``."""
    path = fetched_documents_file()
    rows = _rows(str(path), path.stat().st_mtime, register)
    if not rows:
        which = "fortunes-zh" if register == "classical" else ",".join(p.name for p in PACKAGES[:-1])
        raise FileNotFoundError(f"the fetched debian-zh corpus ({debian_zh_dir()}) holds no {register} documents: "
                                f"run `sampan data fetch debian-zh --packages {which}`")
    return [Document(doc_id, text) for doc_id, text in rows]


def debian_zh_classical_documents() -> list[Document]:
    """``debian_zh_documents("classical")``: fortunes-zh's quotations and Tang / Song poems."""
    return debian_zh_documents("classical")

"""``sampan data build``: corpora -> tokenizer -> token shards + span flags, in one directory.

For each corpus and split (``train``; ``test`` = the fixed held-out documents), documents are cut
into sentences, segmented and entity-tagged (``sampan.text.spans``), tokenized, and packed
greedily, whole sentences of one document at a time, into rows of ``seq_len`` tokens:
``[CLS] sentence sentence ... [SEP] [PAD]...``. Written per (corpus, split):

* ``<corpus>.<split>.tokens.bin``: ``uint16`` token ids, ``rows x seq_len`` (``sampan.io`` format);
* ``<corpus>.<split>.spans.bin``: ``uint8`` span flags, same shape (``sampan.text.spans`` bits);
* ``<corpus>.<split>.docs.json``: which rows hold which document (stable ids).

plus ``tokenizer.json``, ``features.json`` (pinyin / radical / strokes per token id) and
``manifest.json`` (config, counts, sha256 of every file). The directory is assembled under a
temporary name and renamed into place at the end, so a crashed build never looks finished.
The reviews corpus writes only its train split: its test split is the sentiment test set and
must never reach pretraining.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sampan.checkpoint.files import hash_file, json_bytes, load_json, write_synced
from sampan.io import write_token_file
from sampan.text.build_config import DataBuildConfig
from sampan.text.corpus import Document, load_corpus
from sampan.text.features import CharFeatures
from sampan.text.spans import (
    CHAR_BEGIN,
    ENTITY_BEGIN,
    PHRASE_BEGIN,
    SPECIAL,
    char_flags,
    token_flags,
    tool_spans,
)
from sampan.text.tokenizer import CLS_ID, PAD_ID, SEP_ID, ChineseTokenizer
from sampan.utils.atomic import atomic_dir

FORMAT = "sampan-pretrain-data"
FORMAT_VERSION = 1
# Corpora whose test split is an evaluation set of another task: never written.
_NO_TEST_SPLIT = ("reviews",)
_SPECIAL_FLAGS = SPECIAL | CHAR_BEGIN | PHRASE_BEGIN | ENTITY_BEGIN
_SENTENCE_END = re.compile(r"[。！？!?；;…]+[”’」』）)]*|\n")


def sentence_spans(text: str, max_chars: int) -> list[tuple[int, int]]:
    """Sentence-ish pieces of ``text`` (cut after 。！？；… and newlines), none longer than ``max_chars``."""
    pieces, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        pieces.append((start, match.end()))
        start = match.end()
    pieces.append((start, len(text)))
    out = []
    for s, e in pieces:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        while e - s > max_chars:
            out.append((s, s + max_chars))
            s += max_chars
        if e > s:
            out.append((s, e))
    return out


def _clip(spans, s: int, e: int):
    """Spans overlapping [s, e), clipped to it and shifted to start at 0."""
    out = []
    for span in spans:
        a, b = max(span[0], s), min(span[1], e)
        if a < b:
            out.append((a - s, b - s, *span[2:]))
    return out


class _Packer:
    """Packs (ids, flags) pieces of one document into fixed rows: [CLS] pieces [SEP] [PAD]..."""

    def __init__(self, seq_len: int):
        self.seq_len, self.cap = seq_len, seq_len - 2
        self.rows_ids: list[np.ndarray] = []
        self.rows_flags: list[np.ndarray] = []
        self._ids: list[np.ndarray] = []
        self._flags: list[np.ndarray] = []
        self._used = 0

    def add(self, ids: np.ndarray, flags: np.ndarray) -> None:
        for start in range(0, len(ids), self.cap):  # a piece longer than a row is cut
            chunk_ids, chunk_flags = ids[start:start + self.cap], flags[start:start + self.cap]
            if self._used + len(chunk_ids) > self.cap:
                self.flush()
            self._ids.append(chunk_ids)
            self._flags.append(chunk_flags)
            self._used += len(chunk_ids)

    def flush(self) -> None:
        if not self._used:
            return
        ids = np.full(self.seq_len, PAD_ID, dtype=np.uint16)
        flags = np.full(self.seq_len, _SPECIAL_FLAGS, dtype=np.uint8)
        body_ids, body_flags = np.concatenate(self._ids), np.concatenate(self._flags)
        n = len(body_ids)
        ids[0], ids[1:n + 1], ids[n + 1] = CLS_ID, body_ids, SEP_ID
        flags[1:n + 1] = body_flags
        self.rows_ids.append(ids)
        self.rows_flags.append(flags)
        self._ids, self._flags, self._used = [], [], 0


def _annotate(doc: Document, s: int, e: int, spans: str, entities: str):
    text = doc.text[s:e]
    gold_words = _clip(doc.words, s, e)
    gold_entities = [x for x in _clip(doc.entities, s, e) if x[2] in ("PER", "LOC")]
    if spans == "gold":
        words, ents = gold_words, _clip(doc.entities, s, e)
    else:
        words, ents = tool_spans(text, entities)
    return text, char_flags(len(text), words, ents, gold_words, gold_entities)


def encode_documents(docs: list[Document], tokenizer: ChineseTokenizer, seq_len: int, spans: str = "tools",
                     entities: str = "lac+lexicon", on_doc: Callable[[Document], None] | None = None):
    """``(ids [rows, seq_len] uint16, flags [rows, seq_len] uint8, doc_rows [(id, first_row, n_rows)])``."""
    continuation = tokenizer.continuation_mask()
    packer = _Packer(seq_len)
    doc_rows = []
    for doc in docs:
        first = len(packer.rows_ids)
        pieces = [_annotate(doc, s, e, spans, entities) for s, e in sentence_spans(doc.text, seq_len - 2)]
        encodings = tokenizer.encode_batch([text for text, _ in pieces], add_special_tokens=False)
        for (_, cflags), enc in zip(pieces, encodings, strict=True):
            ids = np.asarray(enc.ids, dtype=np.uint16)
            if len(ids):
                packer.add(ids, token_flags(cflags, enc.offsets, continuation[ids]))
        packer.flush()  # rows never mix documents
        doc_rows.append((doc.id, first, len(packer.rows_ids) - first))
        if on_doc is not None:
            on_doc(doc)
    if not packer.rows_ids:
        return (np.zeros((0, seq_len), np.uint16), np.zeros((0, seq_len), np.uint8), doc_rows)
    return np.stack(packer.rows_ids), np.stack(packer.rows_flags), doc_rows


_CHUNK_CHARS = 20_000  # documents go to worker processes in chunks of about this many characters


def _chunks(docs: list[Document]) -> list[list[Document]]:
    chunks, current, size = [], [], 0
    for doc in docs:
        current.append(doc)
        size += len(doc.text)
        if size >= _CHUNK_CHARS:
            chunks.append(current)
            current, size = [], 0
    if current:
        chunks.append(current)
    return chunks


def _encode_chunk(tokenizer_json: str, docs: list[Document], seq_len: int, spans: str, entities: str):
    """Worker side of a parallel build: the tokenizer travels as its JSON (it does not pickle)."""
    return encode_documents(docs, ChineseTokenizer.from_json(tokenizer_json), seq_len, spans, entities)


def encode_parallel(docs: list[Document], tokenizer: ChineseTokenizer, seq_len: int, spans: str, entities: str,
                    workers: int, on_doc: Callable[[Document], None] | None = None):
    """``encode_documents`` over ``workers`` processes; the same output, row for row.

    Each document is encoded on its own (rows never mix documents), so chunks can be encoded
    anywhere and concatenated in order. Workers are spawned, not forked: the parent may hold
    tokenizers' thread pool, which a fork would copy mid-flight.
    """
    if workers <= 1 or len(docs) < 2:
        return encode_documents(docs, tokenizer, seq_len, spans, entities, on_doc)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    tokenizer_json = tokenizer.to_json()
    chunks = _chunks(docs)
    parts = []
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_encode_chunk, tokenizer_json, chunk, seq_len, spans, entities) for chunk in chunks]
        for chunk, future in zip(chunks, futures, strict=True):
            parts.append(future.result())
            for doc in chunk:
                if on_doc is not None:
                    on_doc(doc)
    doc_rows, offset = [], 0
    for ids, _, rows in parts:
        doc_rows += [(doc_id, first + offset, n) for doc_id, first, n in rows]
        offset += len(ids)
    return (np.concatenate([p[0] for p in parts]).reshape(-1, seq_len),
            np.concatenate([p[1] for p in parts]).reshape(-1, seq_len), doc_rows)


def _progress():
    """A rich progress bar over characters on a terminal; a line per corpus elsewhere."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    return Progress(TextColumn("[bold]data build {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("chars"), TimeRemainingColumn(), console=console,
                    disable=not console.is_terminal)


def build_data(config: DataBuildConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the build; returns the manifest (also written to ``out/manifest.json``)."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    out = Path(config.out)
    if (out / "manifest.json").exists() and not config.overwrite:
        raise ValueError(f"{out} already holds a data build; pass --overwrite to replace it, or use another --out")
    if out.exists() and not (out / "manifest.json").exists() and any(out.iterdir()):
        raise ValueError(f"{out} exists and is not a data build; choose an empty or new --out")
    started = time.perf_counter()
    splits = {}
    for name in config.corpora:
        for split in ("train", "test"):
            if split == "test" and name in _NO_TEST_SPLIT:
                continue
            docs = load_corpus(name, split, config.split_seed)
            limit = config.max_test_docs if split == "test" and config.max_test_docs else config.max_docs
            if limit:
                docs = docs[:limit]
            if config.spans == "gold" and not any(d.words for d in docs):
                raise ValueError(f"spans='gold' needs gold segmentation, which corpus {name!r} lacks; "
                                 "use --spans tools, or build it separately")
            splits[(name, split)] = docs
    with atomic_dir(out) as tmp:
        if config.tokenizer:
            tokenizer = ChineseTokenizer.load(config.tokenizer)
        else:
            train_texts = [d.text for (_, split), docs in splits.items() if split == "train" for d in docs]
            tokenizer = ChineseTokenizer.train(train_texts, config.vocab_size, config.min_frequency)
        tokenizer.save(tmp / "tokenizer.json")
        CharFeatures.build(tokenizer.tokens()).save(tmp / "features.json")
        log(f"data build: tokenizer with {tokenizer.vocab_size} tokens; corpora {', '.join(config.corpora)}")
        shards, total_chars = [], sum(len(d.text) for docs in splits.values() for d in docs)
        progress = _progress()
        with progress:
            task = progress.add_task("", total=total_chars)
            for (name, split), docs in splits.items():
                progress.update(task, description=f"{name}.{split}")
                t0 = time.perf_counter()
                ids, flags, doc_rows = encode_parallel(
                    docs, tokenizer, config.seq_len, config.spans, config.entities, config.workers,
                    on_doc=lambda d: progress.advance(task, len(d.text)))
                shards.append(_write_shard(tmp, name, split, ids, flags, doc_rows, sum(len(d.text) for d in docs)))
                log(f"data build: {name}.{split}: {len(docs)} documents -> {len(ids)} rows "
                    f"({time.perf_counter() - t0:.1f} s)")
        seconds = time.perf_counter() - started
        manifest = {
            "format": FORMAT, "version": FORMAT_VERSION, "config": dataclasses.asdict(config),
            "seq_len": config.seq_len, "vocab_size": tokenizer.vocab_size, "token_dtype": "uint16",
            "files": {name: hash_file(tmp / name) for name in ("tokenizer.json", "features.json")},
            "shards": shards,
            "build": {"seconds": round(seconds, 2), "chars": total_chars,
                      "chars_per_sec": round(total_chars / max(seconds, 1e-9))},
        }
        manifest["config"]["corpora"] = list(config.corpora)
        write_synced(tmp / "manifest.json", json_bytes(manifest))
    log(f"data build: {total_chars:,} characters in {seconds:.1f} s "
        f"({total_chars / max(seconds, 1e-9):,.0f} chars/s) -> {out}")
    return manifest


def _write_shard(directory: Path, corpus: str, split: str, ids: np.ndarray, flags: np.ndarray,
                 doc_rows: list, chars: int) -> dict[str, Any]:
    stem = f"{corpus}.{split}"
    files = {"tokens": f"{stem}.tokens.bin", "spans": f"{stem}.spans.bin", "docs": f"{stem}.docs.json"}
    if len(ids):
        write_token_file(directory / files["tokens"], ids.reshape(-1), "uint16")
    else:
        write_synced(directory / files["tokens"], b"")
    write_synced(directory / files["spans"], np.ascontiguousarray(flags, dtype=np.uint8).tobytes())
    write_synced(directory / files["docs"], json_bytes([list(r) for r in doc_rows]))
    real = int(((flags & SPECIAL) == 0).sum())
    return {"corpus": corpus, "split": split, "rows": len(ids), "documents": len(doc_rows), "chars": chars,
            "tokens": real, "files": files, "sha256": {k: hash_file(directory / v)["sha256"] for k, v in files.items()}}


def load_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a build, checked for format; a clear error when ``directory`` is not a build."""
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"{directory} is not a sampan data build (no manifest.json); "
                                "create one with `sampan data build --corpus news,sanguo --out DIR`")
    manifest = load_json(path)
    if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a {FORMAT} v{FORMAT_VERSION} manifest; rebuild with `sampan data build`")
    return manifest

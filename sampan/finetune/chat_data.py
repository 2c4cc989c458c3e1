"""Chat fine-tuning data: JSONL conversations read record by record, bad ones counted, not fatal.

One record per line::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}, ...]}
    {"prompt": "...", "completion": "..."}                      # plain text, no chat template
    {"prompt": [{"role": "user", ...}], "completion": [{"role": "assistant", ...}]}   # or a string

A record that cannot be used (broken JSON, not an object, wrong types, an unknown role, an empty
conversation, no assistant turn, one the template refuses or too long for ``max_length``; the last
two are found while encoding) goes to a ``BadRecords`` log with its file and line number. The run
goes on without it until the log holds more than ``max_bad``, then stops with an error that lists
them; the log's ``summary()`` and ``bad_records.jsonl`` report them at the end either way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

ROLES = ("system", "user", "assistant")
SHOWN = 10  # bad records listed in a summary or an error (all of them go to bad_records.jsonl)


@dataclasses.dataclass
class ChatRecord:
    """One usable record.

    Fields:
        messages: the conversation, ``{"role", "content"}`` dicts (None for a plain-text record).
        prompt: a plain-text record's prompt (no chat template; None for a conversation).
        completion: a plain-text record's completion, the part the loss counts.
        source: the file the record came from.
        line: its line number there (1-based).
    """

    messages: list[dict[str, str]] | None
    prompt: str | None
    completion: str | None
    source: str
    line: int


@dataclasses.dataclass
class BadRecord:
    """A record left out: where it was and why."""

    source: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason}"


class TooManyBadRecords(ValueError):
    """More bad records than ``max_bad``: the data is probably not in the expected format."""


class BadRecordError(ValueError):
    """Raised by the checks for one record; the caller logs it as a ``BadRecord``."""


class BadRecords:
    """The bad records of a run, with the ``max_bad`` limit past which the run stops."""

    def __init__(self, max_bad: int):
        self.max_bad = max_bad
        self.items: list[BadRecord] = []

    def add(self, source: str, line: int, reason: str) -> None:
        """Log one bad record; past ``max_bad`` raise ``TooManyBadRecords`` listing them."""
        self.items.append(BadRecord(source, line, reason))
        if len(self.items) > self.max_bad:
            raise TooManyBadRecords(
                f"{len(self.items)} bad records, more than max_bad={self.max_bad}; is the data in the chat format "
                f'({{"messages": [{{"role": "user", "content": ...}}, ...]}} per line)? Fix them, or raise '
                f"chat.max_bad (--max-bad) to skip them:\n" + self._listing())

    def __len__(self) -> int:
        return len(self.items)

    def ordered(self) -> list[BadRecord]:
        """The bad records by file and line (encoding finds some after reading found others)."""
        return sorted(self.items, key=lambda item: (item.source, item.line))

    def _listing(self) -> str:
        lines = [f"  {item}" for item in self.ordered()[:SHOWN]]
        if len(self.items) > SHOWN:
            lines.append(f"  ... and {len(self.items) - SHOWN} more")
        return "\n".join(lines)

    def counts(self) -> dict[str, int]:
        """Bad records by kind (the reason up to its first colon)."""
        return dict(Counter(item.reason.split(":")[0] for item in self.items))

    def summary(self) -> str:
        """One paragraph: how many, of which kinds, and the first ones with their line numbers."""
        if not self.items:
            return "bad records: none"
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts().items(), key=lambda kv: -kv[1]))
        return f"bad records: {len(self.items)} skipped (max_bad {self.max_bad}): {kinds}\n{self._listing()}"

    def write(self, path: str | os.PathLike) -> Path:
        """Every bad record as JSONL (``{"source", "line", "reason"}``), atomically."""
        from sampan.utils.atomic import atomic_write

        text = "".join(json.dumps(dataclasses.asdict(item), ensure_ascii=False) + "\n" for item in self.ordered())
        return atomic_write(path, text)


def _messages(value: Any, what: str) -> list[dict[str, str]]:
    if not isinstance(value, list):
        raise BadRecordError(f"wrong type: {what} must be a list of {{role, content}} messages, "
                             f"got {type(value).__name__}")
    if not value:
        raise BadRecordError(f"empty conversation: {what} holds no message")
    out = []
    for k, message in enumerate(value, 1):
        if not isinstance(message, dict):
            raise BadRecordError(f"wrong type: message {k} must be an object, got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str):
            raise BadRecordError(f"wrong type: message {k} has no role string")
        if role not in ROLES:
            raise BadRecordError(f"unknown role: message {k} has role {role!r} (roles: {', '.join(ROLES)})")
        if not isinstance(content, str):
            raise BadRecordError(f"wrong type: message {k} content must be a string, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    return out


def parse_record(obj: Any, source: str, line: int) -> ChatRecord:
    """A ``ChatRecord`` from one decoded JSON line, or ``BadRecordError`` saying what is wrong."""
    if not isinstance(obj, dict):
        raise BadRecordError(f"wrong type: a record must be a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        messages = _messages(obj["messages"], "messages")
    elif "prompt" in obj and "completion" in obj:
        prompt, completion = obj["prompt"], obj["completion"]
        if isinstance(prompt, str) and isinstance(completion, str):
            if not completion:
                raise BadRecordError("empty conversation: the completion is empty")
            return ChatRecord(None, prompt, completion, source, line)
        messages = _messages(prompt, "prompt")
        messages += ([{"role": "assistant", "content": completion}] if isinstance(completion, str)
                     else _messages(completion, "completion"))
    else:
        raise BadRecordError(f"wrong type: a record needs 'messages' (or 'prompt' and 'completion'); it has "
                             f"{sorted(obj)[:6]}")
    if not any(m["role"] == "assistant" for m in messages):
        raise BadRecordError("no assistant turn: nothing to learn from")
    if messages[0]["role"] == "assistant":
        raise BadRecordError("starts with an assistant turn: nothing comes before it to be its prompt")
    return ChatRecord(messages, None, None, source, line)


def read_chat_jsonl(path: str | os.PathLike, bad: BadRecords) -> list[ChatRecord]:
    """The usable records of one JSONL file; the others go to ``bad`` (blank lines are skipped)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"chat data file {path} not found")
    records = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as err:
                bad.add(path.name, number, f"broken JSON: {err.msg} at column {err.colno}")
                continue
            try:
                records.append(parse_record(obj, path.name, number))
            except BadRecordError as err:
                bad.add(path.name, number, str(err))
    return records


def _is_dev(record: ChatRecord, seed: int, fraction: float) -> bool:
    # By the record's content, so a record keeps its split when the file is reordered or grows.
    text = json.dumps(record.messages if record.messages is not None else [record.prompt, record.completion],
                      ensure_ascii=False, sort_keys=True)
    digest = hashlib.sha256(f"{seed}:{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 < fraction


@dataclasses.dataclass
class ChatData:
    """The train and dev records of a chat fine-tune (dev scores the loss; there is no test split)."""

    train: list[ChatRecord]
    dev: list[ChatRecord]

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "dev": len(self.dev)}


def load_chat_data(data: str | os.PathLike, bad: BadRecords, dev_fraction: float = 0.1, seed: int = 0,
                   max_train: int | None = None, max_eval: int | None = None) -> ChatData:
    """Read ``data``: a JSONL file (dev = a seeded hash share ``dev_fraction`` of it) or a directory
    with ``train.jsonl`` and an optional ``dev.jsonl``. ``max_train`` / ``max_eval`` keep a seeded
    sample of each split."""
    path = Path(data)
    if path.is_dir():
        train_file = path / "train.jsonl"
        if not train_file.is_file():
            raise FileNotFoundError(f"{path} holds no train.jsonl (a chat data directory has train.jsonl and "
                                    "optionally dev.jsonl)")
        train = read_chat_jsonl(train_file, bad)
        dev = read_chat_jsonl(path / "dev.jsonl", bad) if (path / "dev.jsonl").is_file() else None
    elif path.is_file():
        train, dev = read_chat_jsonl(path, bad), None
    else:
        raise FileNotFoundError(f"chat data {data} not found: give a JSONL file of {{\"messages\": [...]}} records or "
                                "a directory with train.jsonl [dev.jsonl]")
    if dev is None:
        records = train
        train = [r for r in records if not _is_dev(r, seed, dev_fraction)]
        dev = [r for r in records if _is_dev(r, seed, dev_fraction)]
    rng = random.Random(seed)
    if max_train is not None and len(train) > max_train:
        train = sorted(rng.sample(train, max_train), key=lambda r: (r.source, r.line))
    if max_eval is not None and len(dev) > max_eval:
        dev = sorted(rng.sample(dev, max_eval), key=lambda r: (r.source, r.line))
    if not train:
        raise ValueError(f"no usable training conversation in {data}" + (f"; {bad.summary()}" if len(bad) else ""))
    return ChatData(train, dev)

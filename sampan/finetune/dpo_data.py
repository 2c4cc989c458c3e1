"""Preference pairs for DPO: JSONL records -> token ids -> padded batches.

A record is one JSON object per line::

    {"prompt": "写一句问候", "chosen": "你好！", "rejected": "滚。"}
    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
     "chosen": {"role": "assistant", "content": "..."}, "rejected": [{"role": "assistant", "content": "..."}]}

``prompt`` (a string, rendered as one user turn) or ``messages`` (the conversation so far) is the
context; ``chosen`` / ``rejected`` are the preferred and the dispreferred reply, each a string or an
assistant message (alone or in a one-element list, TRL's conversational form). With
``DPOConfig.reference="precomputed"`` each record also carries ``ref_chosen_logps`` and
``ref_rejected_logps``. Everything goes through the model's chat template, tokenized as TRL's
``DPOTrainer`` does: the prompt with the generation prompt, prompt + reply without it, and the
reply starts where the two token lists part. A record that cannot be used is counted and
reported with its line number (in chat SFT's ``BadRecords`` log, reasons in its "kind: detail"
form), never fatal unless there are more than ``max_bad``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from sampan.finetune.chat_data import BadRecordError, BadRecords, TooManyBadRecords
from sampan.finetune.dpo_config import REF_CHOSEN_FIELD, REF_REJECTED_FIELD, DPOConfig
from sampan.text.chat_template import ChatTemplateError
from sampan.text.corpus.document import held_out

ROLES = ("system", "user", "assistant")
TRAIN_FILE, DEV_FILE = "train.jsonl", "dev.jsonl"


@dataclasses.dataclass
class PreferencePair:
    """One tokenized preference pair: the shared prompt and the two completions, as token ids.

    ``ref_chosen_logps`` / ``ref_rejected_logps`` are the record's precomputed reference
    log-probabilities (None unless ``reference="precomputed"``); ``line`` is where it came from.
    """

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    line: int = 0
    source: str = ""
    ref_chosen_logps: float | None = None
    ref_rejected_logps: float | None = None

    @property
    def length(self) -> int:
        """Tokens of the longer of prompt + chosen and prompt + rejected (what a batch pads to)."""
        return len(self.prompt_ids) + max(len(self.chosen_ids), len(self.rejected_ids))


# -- one record -------------------------------------------------------------------------------
def _message(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise BadRecordError(f"wrong type: {what} must be a {{role, content}} object, got {type(value).__name__}")
    role, content = value.get("role"), value.get("content")
    if role not in ROLES:
        raise BadRecordError(f"unknown role: {what} has role {role!r} (roles: {', '.join(ROLES)})")
    if not isinstance(content, str):
        raise BadRecordError(f"wrong type: {what} content must be a string, got {type(content).__name__}")
    return {"role": role, "content": content}


def _reply(record: Mapping[str, Any], key: str) -> dict[str, str]:
    value = record.get(key)
    if value is None:
        raise BadRecordError(f"missing field: no {key!r} (each record needs 'chosen' and 'rejected')")
    if isinstance(value, list):
        if len(value) != 1:
            raise BadRecordError(f"wrong type: {key!r} as a list must hold exactly one assistant message, got {len(value)}")
        value = value[0]
    message = {"role": "assistant", "content": value} if isinstance(value, str) else _message(value, repr(key))
    if message["role"] != "assistant":
        raise BadRecordError(f"wrong role: {key!r} is a {message['role']!r} message; a reply is the assistant's")
    if not message["content"].strip():
        raise BadRecordError(f"empty reply: {key!r} holds no text")
    return message


def _prompt(record: Mapping[str, Any]) -> list[dict[str, str]]:
    has_prompt, has_messages = "prompt" in record, "messages" in record
    if has_prompt == has_messages:
        raise BadRecordError("wrong type: give either 'prompt' (a string or messages) or 'messages' (the conversation "
                        "so far)" + (", not both" if has_prompt else ""))
    value = record["prompt" if has_prompt else "messages"]
    if isinstance(value, str):
        if not value.strip():
            raise BadRecordError("empty prompt: 'prompt' holds no text")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise BadRecordError(f"wrong type: {'prompt' if has_prompt else 'messages'} must be a string or a non-empty list "
                        "of messages")
    return [_message(m, f"message {i + 1}") for i, m in enumerate(value)]


def _ref(record: Mapping[str, Any], key: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRecordError(f"missing reference: reference='precomputed' needs a finite number in {key!r}, "
                        f"got {value!r}")
    if value > 1e-3:  # a sum of log-probabilities is <= 0
        raise BadRecordError(f"missing reference: {key!r} is {value}, but a log-probability sum cannot be positive")
    return float(value)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def encode_record(record: Any, tokenizer: Any, config: DPOConfig, max_length: int | None,
                  system_prompt: str | None = None) -> PreferencePair:
    """Tokenize one record (a parsed JSON value) as TRL's ``DPOTrainer`` does; raises ``BadRecordError``.

    ``system_prompt`` goes first in a prompt that has no system message. The prompt keeps its last
    ``config.max_prompt_length`` tokens; the completions are cut (their ends dropped) so prompt +
    completion fit ``max_length``. A prompt that leaves no room is bad.
    """
    if not isinstance(record, Mapping):
        raise BadRecordError(f"wrong type: a record must be a JSON object, got {type(record).__name__}")
    prompt, chosen, rejected = _prompt(record), _reply(record, "chosen"), _reply(record, "rejected")
    if system_prompt is not None and prompt[0]["role"] != "system":
        prompt = [{"role": "system", "content": system_prompt}, *prompt]
    if chosen["content"] == rejected["content"]:
        raise BadRecordError("same reply: 'chosen' and 'rejected' are the same (the pair prefers nothing)")
    refs = {}
    if config.reference == "precomputed":
        refs = {"ref_chosen_logps": _ref(record, REF_CHOSEN_FIELD),
                "ref_rejected_logps": _ref(record, REF_REJECTED_FIELD)}
    try:
        prompt_ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
        with_chosen = tokenizer.apply_chat_template([*prompt, chosen])
        with_rejected = tokenizer.apply_chat_template([*prompt, rejected])
    except ChatTemplateError as err:
        raise BadRecordError(f"template error: the chat template refused it: {err}") from err
    # The completion starts where prompt and prompt + reply part (a template may render the prompt
    # alone differently, or tokens may merge across the boundary): TRL's rule, so ids match its own.
    start = min(_common_prefix(prompt_ids, with_chosen), _common_prefix(prompt_ids, with_rejected))
    prompt_ids, chosen_ids, rejected_ids = list(prompt_ids[:start]), with_chosen[start:], with_rejected[start:]
    if not chosen_ids or not rejected_ids:
        raise BadRecordError("empty reply: a reply renders to no tokens after the prompt")
    if config.max_prompt_length is not None and len(prompt_ids) > config.max_prompt_length:
        prompt_ids = prompt_ids[-config.max_prompt_length:]  # keep the end, next to the reply
    if max_length is not None:
        room = max_length - len(prompt_ids)
        if room < 1:
            raise BadRecordError(f"too long: the prompt takes {len(prompt_ids)} tokens, leaving no room for a reply "
                            f"within max_length={max_length}; raise max_length or set dpo.max_prompt_length")
        chosen_ids, rejected_ids = chosen_ids[:room], rejected_ids[:room]
    return PreferencePair(prompt_ids, list(chosen_ids), list(rejected_ids), **refs)


# -- files ------------------------------------------------------------------------------------
def read_preferences(path: str | Path, tokenizer: Any, config: DPOConfig, max_length: int | None,
                     bad: BadRecords, system_prompt: str | None = None) -> list[PreferencePair]:
    """The usable pairs of a JSONL file of preference records, tokenized; the others go to ``bad``.

    Broken JSON, a missing or empty field, an unknown role, a template error or a prompt longer
    than ``max_length`` makes a record bad: it is logged with its line number and skipped. Past
    ``bad.max_bad`` records the log raises ``TooManyBadRecords`` listing them.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"preference data {path} does not exist; give a JSONL file of "
                                "{'prompt' or 'messages', 'chosen', 'rejected'} records")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"{getattr(tokenizer, 'name_or_path', None) or 'the tokenizer'} has no chat template, and "
                         "DPO renders every prompt and reply through one: give one (chat.chat_template, "
                         "--chat-template FILE.jinja) or start from a chat model")
    pairs = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                try:
                    record = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    raise BadRecordError(f"broken JSON: {err}") from err
                pair = encode_record(record, tokenizer, config, max_length, system_prompt)
            except BadRecordError as err:
                try:
                    bad.add(path.name, number, str(err))
                except TooManyBadRecords:
                    raise TooManyBadRecords(
                        f"{len(bad)} bad preference records, more than max_bad={bad.max_bad}; is the data in the "
                        "DPO format ({\"prompt\" or \"messages\", \"chosen\", \"rejected\"} per line)? Fix them, or "
                        f"raise chat.max_bad (--max-bad) to skip them.\n{bad.summary()}") from None
                continue
            pair.line, pair.source = number, path.name
            pairs.append(pair)
    return pairs


def preference_splits(data: str | Path, tokenizer: Any, config: DPOConfig, max_length: int | None,
                      dev_fraction: float, seed: int, bad: BadRecords, system_prompt: str | None = None
                      ) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """Train and dev pairs from ``data``: a directory with ``train.jsonl`` [``dev.jsonl``], or one
    JSONL file. Without a dev file, ``dev_fraction`` of the prompts (by a seeded hash of the prompt's
    tokens, so pairs on one prompt stay together) is held out. Bad records go to ``bad``."""
    data = Path(data)
    if data.is_dir() and not (data / TRAIN_FILE).is_file():
        raise FileNotFoundError(f"{data} holds no {TRAIN_FILE} (a preference data directory has {TRAIN_FILE} and "
                                f"optionally {DEV_FILE})")
    read = [read_preferences(f, tokenizer, config, max_length, bad, system_prompt)
            for f in ([data / TRAIN_FILE, *([data / DEV_FILE] if (data / DEV_FILE).is_file() else [])]
                      if data.is_dir() else [data])]
    if len(read) == 2:
        train, dev = read
    else:
        train, dev = [], []
        for pair in read[0]:
            (dev if held_out(",".join(map(str, pair.prompt_ids)), dev_fraction, seed) else train).append(pair)
    if not train:
        raise ValueError(f"no usable training pair in {data}" + (f"; {bad.summary()}" if len(bad) else ""))
    return train, dev


# -- batches ----------------------------------------------------------------------------------
class PreferenceDataset:
    """A list of ``PreferencePair`` as the Trainer's map-style dataset (``lengths`` for grouping)."""

    def __init__(self, pairs: Sequence[PreferencePair]):
        self.pairs = list(pairs)
        self.lengths = [pair.length for pair in self.pairs]

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> PreferencePair:
        return self.pairs[index]


@dataclasses.dataclass
class PreferenceCollator:
    """Pairs -> one batch: ``B`` prompt + chosen rows, then ``B`` prompt + rejected rows, right-padded
    with ``pad_token_id`` (TRL's ``DataCollatorForPreference`` layout). ``completion_mask`` marks
    the reply tokens; ``ref_chosen_logps`` / ``ref_rejected_logps`` come along when the pairs have them."""

    pad_token_id: int

    def __call__(self, pairs: Sequence[PreferencePair]) -> dict[str, torch.Tensor]:
        rows = [p.prompt_ids + p.chosen_ids for p in pairs] + [p.prompt_ids + p.rejected_ids for p in pairs]
        replies = [len(p.chosen_ids) for p in pairs] + [len(p.rejected_ids) for p in pairs]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        completion_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (row, reply) in enumerate(zip(rows, replies, strict=True)):
            input_ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
            attention_mask[i, :len(row)] = 1
            completion_mask[i, len(row) - reply:len(row)] = 1
        batch = {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask}
        if pairs and all(p.ref_chosen_logps is not None and p.ref_rejected_logps is not None for p in pairs):
            batch["ref_chosen_logps"] = torch.tensor([p.ref_chosen_logps for p in pairs], dtype=torch.float32)
            batch["ref_rejected_logps"] = torch.tensor([p.ref_rejected_logps for p in pairs], dtype=torch.float32)
        return batch

"""Held-out figures for a chat model on the instruction set of ``sampan data build-chat``.

- ``entities``: exact-match F1 over (type, name) pairs, micro-averaged over the records: the reply
  is parsed from the fixed ``人名：…；地名：…；机构名：…`` format (full- or half-width marks, as a
  WordPiece tokenizer's NFKC turns them);
- ``sentiment``: accuracy of the one-word answer (积极 / 消极; a reply holding neither, or both,
  is wrong);
- ``poem``: the share of poems in the asked form: the asked number of lines, each of the asked
  number of characters.

Replies are generated greedily (``generate`` with its KV cache, eager) from the prompt the model's
own chat template renders (the record's messages before the assistant's, with the generation
prompt), so base and fine-tuned models are scored the same way.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import Any

from sampan.text.chat_corpus import ENTITY_NAMES, NO_ENTITY, SENTIMENT_WORDS, poem_lines

SCORED_TASKS = ("entities", "sentiment", "poem")
_LABEL_OF = {name: label for label, name in ENTITY_NAMES.items()}
_NAME_SPLIT = re.compile(r"[、,，/\s]+")


def _normal(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower().strip()


def parse_entities(reply: str) -> set[tuple[str, str]]:
    """``{(label, name)}`` from a reply in the ``人名：A、B；地名：C；机构名：无`` format.

    Parts are found by their label names wherever they are (a part left out lists nothing);
    names are NFKC-normalised and lower-cased, as the gold side is."""
    text = _normal(reply)
    found: set[tuple[str, str]] = set()
    names = "|".join(re.escape(n) for n in sorted(_LABEL_OF, key=len, reverse=True))
    for match in re.finditer(rf"({names})\s*:\s*([^;]*)", text):
        label = _LABEL_OF[match.group(1)]
        for name in _NAME_SPLIT.split(match.group(2)):
            name = name.strip("。.")
            if name and name != NO_ENTITY:
                found.add((label, name))
    return found


def entity_f1(replies: Sequence[str], golds: Sequence[str]) -> dict[str, float]:
    """Micro precision / recall / F1 of the (label, name) pairs of ``replies`` against ``golds``
    (both in the answer format); F1 is 1.0 when neither side names anything."""
    if len(replies) != len(golds):
        raise ValueError(f"{len(replies)} replies for {len(golds)} gold answers")
    tp = n_pred = n_gold = 0
    for reply, gold in zip(replies, golds, strict=True):
        pred, want = parse_entities(reply), parse_entities(gold)
        tp += len(pred & want)
        n_pred += len(pred)
        n_gold += len(want)
    precision = tp / n_pred if n_pred else float(n_gold == 0)
    recall = tp / n_gold if n_gold else float(n_pred == 0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def sentiment_of(reply: str) -> str | None:
    """"pos" / "neg" when the reply names exactly one of 积极 / 消极, else None."""
    text = _normal(reply)
    said = [label for label, word in SENTIMENT_WORDS.items() if word in text]
    return said[0] if len(said) == 1 else None


def sentiment_accuracy(replies: Sequence[str], labels: Sequence[str]) -> float:
    """The share of replies whose one word is the gold label ("pos" / "neg")."""
    if len(replies) != len(labels):
        raise ValueError(f"{len(replies)} replies for {len(labels)} labels")
    if not replies:
        return float("nan")
    return sum(sentiment_of(r) == g for r, g in zip(replies, labels, strict=True)) / len(replies)


def in_form(reply: str, lines: int, chars_per_line: int) -> bool:
    """Whether ``reply`` is a poem of ``lines`` lines of ``chars_per_line`` characters each."""
    got = poem_lines(reply)
    return len(got) == lines and all(len(line) == chars_per_line for line in got)


def poem_form_share(replies: Sequence[str], forms: Sequence[tuple[int, int]]) -> float:
    """The share of ``replies`` in their asked ``(lines, chars_per_line)`` form."""
    if len(replies) != len(forms):
        raise ValueError(f"{len(replies)} replies for {len(forms)} forms")
    if not replies:
        return float("nan")
    return sum(in_form(r, *f) for r, f in zip(replies, forms, strict=True)) / len(replies)


def score(records: Sequence[dict[str, Any]], replies: Sequence[str]) -> dict[str, Any]:
    """The held-out figures of ``replies`` to ``records`` (records of the scored tasks; others are
    counted, not scored)."""
    by_task: dict[str, list[tuple[dict, str]]] = {}
    for record, reply in zip(records, replies, strict=True):
        by_task.setdefault(record["task"], []).append((record, reply))
    out: dict[str, Any] = {"records": {task: len(rows) for task, rows in sorted(by_task.items())}}
    if rows := by_task.get("entities"):
        out["entity_f1"] = entity_f1([r for _, r in rows], [rec["messages"][-1]["content"] for rec, _ in rows])["f1"]
    if rows := by_task.get("sentiment"):
        labels = [rec.get("meta", {}).get("label") or sentiment_of(rec["messages"][-1]["content"]) for rec, _ in rows]
        out["sentiment_accuracy"] = sentiment_accuracy([r for _, r in rows], labels)
    if rows := by_task.get("poem"):
        forms = [(rec["meta"]["lines"], rec["meta"]["chars_per_line"]) for rec, _ in rows]
        out["poem_form_share"] = poem_form_share([r for _, r in rows], forms)
    return out


def generate_replies(model: Any, tokenizer: Any, conversations: Sequence[Sequence[dict[str, str]]],
                     max_new_tokens: int = 64, batch_size: int = 16) -> list[str]:
    """Greedy replies of ``model`` (a sampan causal LM with ``generate``) to ``conversations``
    (the messages before the reply), rendered with ``tokenizer``'s chat template
    (a ``PretrainedTokenizer``). Prompts are left-padded in batches; the reply stops at the
    tokenizer's eos token (its ``sep_token`` for sampan's WordPiece ones) or the config's eos."""
    import torch

    config = model.config
    eos = [i for i in (tokenizer.eos_token_id, tokenizer.sep_token_id) if i is not None]
    eos += [i for i in ([config.eos_token_id] if isinstance(config.eos_token_id, int) else config.eos_token_id or [])
            if i not in eos]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos or [0])[0]
    limit = config.max_position_embeddings - max_new_tokens
    if limit < 1:
        raise ValueError(f"max_new_tokens ({max_new_tokens}) leaves no room for a prompt in the model's "
                         f"{config.max_position_embeddings} positions")
    prompts = [tokenizer.apply_chat_template(list(c), add_generation_prompt=True) for c in conversations]
    # A prompt longer than the window keeps its end: the question and the generation prompt.
    prompts = [p[-limit:] for p in prompts]
    device = next(model.parameters()).device
    replies: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start: start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, p in enumerate(batch):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        out = model.generate(ids.to(device), max_new_tokens=max_new_tokens, attention_mask=mask.to(device),
                             eos_token_id=eos or None, pad_token_id=pad)
        for row in out[:, width:].tolist():
            cut = next((k for k, t in enumerate(row) if t in eos), len(row))
            replies.append(tokenizer.decode(row[:cut], skip_special_tokens=True).strip())
    return replies


def evaluate_chat(model: Any, tokenizer: Any, records: Sequence[dict[str, Any]], max_new_tokens: int = 64,
                  batch_size: int = 16, tasks: Sequence[str] = SCORED_TASKS) -> dict[str, Any]:
    """Generate greedy replies to the ``tasks`` records of ``records`` and score them (``score``).
    Poems get room for a 律诗 (at least 8 x 8 tokens) whatever ``max_new_tokens`` says."""
    chosen = [r for r in records if r["task"] in tasks]
    replies: list[str] = [""] * len(chosen)
    for task in tasks:  # one length per task: a one-word sentiment needs few tokens
        index = [i for i, r in enumerate(chosen) if r["task"] == task]
        if not index:
            continue
        new = max(max_new_tokens, 66) if task == "poem" else 8 if task == "sentiment" else max_new_tokens
        new = min(new, model.config.max_position_embeddings - 16)
        got = generate_replies(model, tokenizer, [chosen[i]["messages"][:-1] for i in index], new, batch_size)
        for i, reply in zip(index, got, strict=True):
            replies[i] = reply
    return {**score(chosen, replies), "examples": [
        {"task": r["task"], "prompt": r["messages"][-2]["content"], "reply": reply}
        for r, reply in list(zip(chosen, replies, strict=True))[:: max(1, len(chosen) // 6)]]}


__all__ = ["SCORED_TASKS", "entity_f1", "evaluate_chat", "generate_replies", "in_form", "parse_entities",
           "poem_form_share", "score", "sentiment_accuracy", "sentiment_of"]

"""Conversations to token ids and labels: the model's own chat template renders them, and the loss
counts the assistant turns' tokens only (every other label is -100).

Where an assistant turn lies in the rendered text is found by rendering prefixes of the
conversation, as TRL and LLaMA-Factory do: for assistant message ``i``,

* ``render(messages[:i], add_generation_prompt=True)`` ends where the reply starts (the prompt a
  model is given at inference), and
* ``render(messages[:i + 1])`` ends where the turn ends (its end-of-turn token included, trailing
  whitespace not), so the model learns to stop.

Each piece of the text between those boundaries is tokenized on its own, so the prompt's tokens
are exactly the ones inference feeds (``apply_chat_template(..., add_generation_prompt=True)``)
and no token straddles a prompt and a reply. This needs a template whose rendering of a prefix is
a prefix of the whole conversation's (ChatML / Qwen2.5, Llama 3, most are); one that is not (Qwen3
drops earlier turns' ``<think>`` blocks; some templates put a date or the last message's tools
in the system turn) is refused with ``TemplatePrefixError``, which says which turn broke it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from sampan.finetune.chat_data import BadRecordError, BadRecords, ChatRecord
from sampan.text.chat_template import ChatTemplateError, render_chat, select_template

IGNORE = -100


class TemplatePrefixError(ValueError):
    """The chat template renders a prefix of a conversation as text that is not a prefix of the
    whole conversation's, so assistant turns cannot be found by rendering prefixes."""


@dataclasses.dataclass
class EncodedChat:
    """One conversation as the model trains on it.

    Fields:
        input_ids: the rendered conversation's token ids (cut after its last assistant turn).
        labels: ``input_ids`` where the token belongs to an assistant turn, else -100.
        source / line: where the record came from (for messages about it).
    """

    input_ids: list[int]
    labels: list[int]
    source: str = ""
    line: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def assistant_tokens(self) -> int:
        return sum(label != IGNORE for label in self.labels)


class ChatEncoder:
    """Encodes ``ChatRecord``s with ``tokenizer``'s chat template (see the module docstring).

    ``max_length`` bounds a conversation: one longer is cut after its last assistant turn that
    fits; a single turn longer than it, or a first assistant turn that ends past it, makes the
    record bad (``BadRecordError``). ``system_prompt`` goes first in conversations that have no
    system message.
    """

    def __init__(self, tokenizer: Any, max_length: int, system_prompt: str | None = None,
                 chat_template: str | None = None):
        self.tokenizer, self.max_length, self.system_prompt = tokenizer, max_length, system_prompt
        self._template: str | None = None
        self._chat_template = chat_template

    @property
    def template(self) -> str:
        """The template text (the tokenizer's unless one was given); an error when there is none."""
        if self._template is None:
            self._template = select_template(getattr(self.tokenizer, "chat_template", None), self._chat_template,
                                             where=getattr(self.tokenizer, "name_or_path", None) or "the tokenizer")
        return self._template

    def _render(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        variables = dict(getattr(self.tokenizer, "special_tokens_map", {}) or {})
        return render_chat(self.template, messages, add_generation_prompt=generation_prompt, variables=variables)

    def _tokens(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return list(getattr(ids, "ids", ids))

    def spans(self, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int, int]]]:
        """The rendered conversation and each assistant turn's ``(start, end, message index)`` in it."""
        try:
            full = self._render(messages, False)
        except ChatTemplateError as err:
            raise BadRecordError(f"template refused it: {err}") from err
        spans: list[tuple[int, int, int]] = []
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            try:
                prompt = self._render(messages[:i], True)
                turn = self._render(messages[:i + 1], False)
            except ChatTemplateError as err:
                raise BadRecordError(f"template refused it: {err}") from err
            for name, text in (("the prompt before", prompt), ("the conversation up to", turn)):
                if not full.startswith(text):
                    at = next((k for k, (a, b) in enumerate(zip(text, full, strict=False)) if a != b),
                              min(len(text), len(full)))
                    raise TemplatePrefixError(
                        f"the chat template renders {name} assistant message {i + 1} as text that is not a prefix of "
                        f"the whole conversation (they differ at character {at}: {text[at:at + 40]!r} vs "
                        f"{full[at:at + 40]!r}), so its assistant tokens cannot be found by rendering prefixes. "
                        "Templates that rewrite earlier turns (Qwen3 drops their <think> blocks) do this: give "
                        "chat.chat_template (--chat-template) a template that renders history unchanged")
            end = len(turn.rstrip())  # the trailing newline after an end-of-turn token is never generated
            start = len(prompt)
            if spans and start < spans[-1][1]:
                raise TemplatePrefixError(f"the chat template's prompt for assistant message {i + 1} overlaps the "
                                          "previous reply; assistant tokens cannot be found by rendering prefixes")
            if end > start:
                spans.append((start, end, i))
        return full, spans

    def encode(self, record: ChatRecord) -> EncodedChat:
        """``record`` as ids and labels; ``BadRecordError`` when it cannot be used."""
        if record.messages is None:
            return self._encode_text(record)
        messages = record.messages
        if self.system_prompt is not None and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        full, spans = self.spans(messages)
        if not spans:
            raise BadRecordError("no assistant turn: every assistant message renders empty")
        ids: list[int] = []
        labels: list[int] = []
        ends: list[int] = []  # token index after each assistant turn
        cursor = 0
        for start, end, index in spans:
            for piece, learn in ((full[cursor:start], False), (full[start:end], True)):
                tokens = self._tokens(piece) if piece else []
                if len(tokens) > self.max_length:
                    what = f"message {index + 1} (assistant)" if learn else f"the text before message {index + 1} (assistant)"
                    raise BadRecordError(f"turn over the length limit: {what} is {len(tokens)} tokens, over "
                                         f"max_length {self.max_length}")
                ids += tokens
                labels += tokens if learn else [IGNORE] * len(tokens)
            ends.append(len(ids))
            cursor = end
        fits = [e for e in ends if e <= self.max_length]
        if not fits:
            raise BadRecordError(f"turn over the length limit: the first assistant turn ends at token {ends[0]}, past "
                                 f"max_length {self.max_length}")
        cut = fits[-1]  # after the last assistant turn that fits; trailing user turns teach nothing
        return EncodedChat(ids[:cut], labels[:cut], record.source, record.line)

    def _encode_text(self, record: ChatRecord) -> EncodedChat:
        """A plain prompt / completion record: the prompt as the tokenizer encodes text (its BOS
        if it adds one), then the completion and the EOS token, which the loss counts."""
        prompt = list(getattr(ids := self.tokenizer.encode(record.prompt), "ids", ids))
        completion = self._tokens(record.completion)
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is not None and (not completion or completion[-1] != eos):
            completion.append(eos)
        if len(prompt) + len(completion) > self.max_length:
            raise BadRecordError(f"turn over the length limit: prompt + completion are {len(prompt) + len(completion)} "
                                 f"tokens, over max_length {self.max_length}")
        return EncodedChat(prompt + completion, [IGNORE] * len(prompt) + completion, record.source, record.line)


def encode_records(records: Iterable[ChatRecord], encoder: ChatEncoder, bad: BadRecords) -> list[EncodedChat]:
    """Encode every record; the ones that cannot be used go to ``bad`` (which stops the run past
    its ``max_bad``). ``TemplatePrefixError`` is not a bad record: it stops the run at once."""
    out = []
    for record in records:
        try:
            out.append(encoder.encode(record))
        except BadRecordError as err:
            bad.add(record.source, record.line, str(err))
    return out

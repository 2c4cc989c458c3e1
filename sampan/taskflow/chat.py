"""``chat``: a reply to a conversation, from a chat model, with its own chat template.

::

    chat = Taskflow("chat")                       # chat-zh-tiny, greedy
    chat("以《春雨》为题，写一首五言绝句。")           # a plain string is one user message
    chat([{"role": "system", "content": "..."}, {"role": "user", "content": "..."}])
    # [{'reply': '...', 'finish_reason': 'stop', 'messages': [...]}]

Input: a string, one conversation (a list of OpenAI-style ``{"role", "content"}`` messages), or a
list of either. The model's chat template (its ``tokenizer_config.json``) renders each with the
generation prompt; ``sampan.inference.Generator`` decodes on the export's prefill and one-step
decode graphs (the KV cache passed between them, ONNX Runtime by default). Options are OpenAI's
names: ``max_tokens``, ``temperature`` (0 = greedy, the default), ``top_p``, ``seed``; and
``top_k``, ``repetition_penalty``, ``stop`` (strings that end a reply).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

from sampan.inference.sampling import SamplingParams
from sampan.taskflow.task import Task

ROLES = ("system", "user", "assistant")


def conversations(inputs: Any) -> tuple[list[list[dict[str, str]]], bool]:
    """``inputs`` as a list of conversations, and whether one was given (not a list of them).

    A string is one user message; a list of dicts is one conversation; a list of strings or of
    lists is several. Raises ``ValueError`` naming the bad item."""
    if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], dict)):
        return [_conversation(inputs, "")], True
    if not isinstance(inputs, (list, tuple)):
        raise ValueError(f"chat input must be a string, a list of {{'role', 'content'}} messages, or a list of those; "
                         f"got {type(inputs).__name__}")
    if not inputs:
        raise ValueError("chat input is an empty list: pass a string or a list of messages")
    return [_conversation(item, f"[{i}]") for i, item in enumerate(inputs)], False


def _conversation(item: Any, where: str) -> list[dict[str, str]]:
    if isinstance(item, str):
        item = [{"role": "user", "content": item}]
    if not isinstance(item, (list, tuple)) or not item:
        raise ValueError(f"chat input{where} must be a non-empty string or list of messages, got {item!r:.80}")
    messages = []
    for k, message in enumerate(item):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ValueError(f"chat input{where} message [{k}] must be a dict with role one of {list(ROLES)}, "
                             f"got {message!r:.80}")
        content = message.get("content")
        if not isinstance(content, str) or not content.strip():
            raise ValueError(f"chat input{where} message [{k}] ({message['role']}) needs a non-empty string content")
        messages.append({"role": message["role"], "content": content})
    return messages


@dataclasses.dataclass(frozen=True)
class ChatOptions:
    """How a reply is decoded (OpenAI's names where it has them).

    Fields:
        max_tokens: the most tokens a reply gets.
        sampling: temperature (0 = greedy, the default), top_k, top_p, repetition_penalty and seed
            (``sampan.inference.SamplingParams``; a seed makes a sampled reply repeatable).
        stop: strings that end a reply (the reply is cut before the first).
    """

    max_tokens: int = 64
    sampling: SamplingParams = dataclasses.field(default_factory=lambda: SamplingParams(seed=0))
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")


SAMPLING_NAMES = tuple(f.name for f in dataclasses.fields(SamplingParams))


def chat_options(base: ChatOptions | None = None, **options: Any) -> ChatOptions:
    """``base`` (default: the defaults) with keyword ``options`` changed: ``max_tokens``, ``stop`` and
    ``SamplingParams``' fields; an unknown one is a ``ValueError`` naming the known ones."""
    base = base or ChatOptions()
    known = ("max_tokens", "stop", *SAMPLING_NAMES)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(f"chat does not take {', '.join(map(repr, unknown))}; its options: {', '.join(known)}")
    sampling = dataclasses.replace(base.sampling, **{k: v for k, v in options.items() if k in SAMPLING_NAMES})
    stop = options.get("stop", base.stop)
    stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
    return ChatOptions(options.get("max_tokens", base.max_tokens), sampling, stop)


class _ReplyText:
    """A reply's text: the tokens decoded without the special ones (an [UNK] is no part of a reply)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class Chat(Task):
    name = "chat"
    description = "reply to a conversation (OpenAI-style messages, or a plain question) with a chat model"
    default_model = "chat-zh-tiny"
    models = ("chat-zh-tiny",)
    option_names = ("max_tokens", "stop", *SAMPLING_NAMES)

    def _construct_model(self, model: str) -> None:
        self.chat_options = chat_options(**self.options)
        self._open(model)

    def _open(self, model: str) -> None:
        """The generator on the export's decode graphs and the model's own tokenizer (with its chat template)."""
        from sampan.inference import Config, create_generator
        from sampan.inference.device import predictor_device
        from sampan.store.model_dir import ModelDir
        from sampan.store.models import resolve
        from sampan.taskflow.runtime import export_dir
        from sampan.text.pretrained_tokenizer import PretrainedTokenizer

        predictor_device(self.device, self.backend)
        directory = resolve(model)
        model_dir = ModelDir(directory)
        found = model_dir.file("tokenizer.json")
        if found is None:
            raise FileNotFoundError(f"{directory} has no tokenizer.json; a chat model needs its tokenizer and chat template")
        self.tokenizer = PretrainedTokenizer.from_pretrained(found.parent)
        if not self.tokenizer.chat_template:
            raise ValueError(f"{directory} has no chat template (tokenizer_config.json's chat_template): it is not a chat "
                             "model; Taskflow('text_generation') continues plain text")
        config = model_dir.config or {}
        self.window = int(config.get("max_position_embeddings", 128))
        eos = config.get("eos_token_id")
        self.eos = {i for i in ([eos] if isinstance(eos, int) else eos or [])}
        self.eos |= {i for i in (self.tokenizer.eos_token_id,) if i is not None}
        if not self.eos:
            raise ValueError(f"{directory}: neither config.json nor the tokenizer names an eos token to end a reply")
        threads = self.num_threads or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                          else os.cpu_count() or 1)
        config = Config(str(export_dir(model, directory)), backend=self.backend, num_threads=threads,
                        precision=self.precision, device=self.device)
        self.generator = create_generator(config, tokenizer=_ReplyText(self.tokenizer), eos_token_id=sorted(self.eos))

    def __call__(self, inputs: Any) -> list[dict[str, Any]]:
        return self.reply(inputs)

    def reply(self, inputs: Any, **options: Any) -> list[dict[str, Any]]:
        """Replies to ``inputs`` (see ``conversations``), one dict per conversation; ``options``
        (``max_tokens``, ``stop``, ``SamplingParams``' fields) change the Taskflow's for this call only."""
        convs, _ = conversations(inputs)
        settings = chat_options(self.chat_options, **options) if options else self.chat_options
        results: list[dict[str, Any]] = []
        for start in range(0, len(convs), self.batch_size):
            batch = convs[start: start + self.batch_size]
            prepared = self._preprocess(batch, settings)
            results.extend(self._postprocess(batch, prepared, self._run_model(prepared, settings)))
        return results

    def _preprocess(self, convs: list[list[dict[str, str]]], settings: ChatOptions | None = None) -> list[list[int]]:
        max_tokens = (settings or self.chat_options).max_tokens
        limit = self.window - max_tokens
        if limit < 1:
            raise ValueError(f"max_tokens ({max_tokens}) leaves no room for a prompt in the model's "
                             f"{self.window} positions")
        rows = []
        for conv in convs:
            ids = self.tokenizer.apply_chat_template(conv, add_generation_prompt=True)
            if len(ids) > limit:
                warnings.warn(f"chat: the conversation is {len(ids)} tokens, more than the {limit} the model's "
                              f"{self.window} positions leave beside max_tokens={max_tokens}; its start is cut",
                              stacklevel=3)
                ids = ids[-limit:]
            rows.append(list(ids))
        return rows

    def _run_model(self, rows: list[list[int]], settings: ChatOptions | None = None) -> list[Any]:
        o = settings or self.chat_options
        return self.generator.generate(rows, o.max_tokens, sampling=o.sampling, stop=o.stop or None)

    def _postprocess(self, convs: list[list[dict[str, str]]], inputs: Any, outputs: list[Any]) -> list[dict[str, Any]]:
        return [{"reply": out.text.strip(), "finish_reason": out.finish_reason, "messages": conv}
                for conv, out in zip(convs, outputs, strict=True)]

"""``chat``: a reply to a conversation, from a chat model, with its own chat template.

::

    chat = Taskflow("chat")                       # chat-zh-tiny, greedy
    chat("以《春雨》为题，写一首五言绝句。")           # a plain string is one user message
    chat([{"role": "system", "content": "..."}, {"role": "user", "content": "..."}])
    # [{'reply': '...', 'finish_reason': 'stop', 'messages': [...]}]

Input: a string, one conversation (a list of OpenAI-style ``{"role", "content"}`` messages), or a
list of either. The model's chat template (its ``tokenizer_config.json``) renders each with the
generation prompt; the exported graph (``input_ids -> logits``, ONNX Runtime) runs the decoding
loop here, which re-reads the window at every step (as ``text_generation`` does). Options are
OpenAI's names: ``max_tokens``, ``temperature`` (0 = greedy, the default), ``top_p``, ``seed``;
and ``top_k``, ``repetition_penalty``.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

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
class Sampling:
    """How a reply is decoded (OpenAI's names where it has them).

    Fields:
        max_tokens: the most tokens a reply gets.
        temperature: 0 = greedy (the default); above 0 samples from softmax(logits / temperature).
        top_p: the nucleus: sample only among the most likely tokens holding this much probability.
        top_k: sample only among the k most likely tokens (0 = no limit).
        seed: the seed of the sampler (a Taskflow's sampler is seeded once; a call with ``seed`` anew).
        repetition_penalty: CTRL's penalty on tokens already in the conversation (1 = none).
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = 0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0 or not 0.0 < self.top_p <= 1.0 or self.repetition_penalty <= 0:
            raise ValueError(f"need temperature >= 0 (0 = greedy), 0 < top_p <= 1, repetition_penalty > 0; got "
                             f"temperature={self.temperature}, top_p={self.top_p}, "
                             f"repetition_penalty={self.repetition_penalty}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 = no limit), got {self.top_k!r}")


def sampling_options(**options: Any) -> Sampling:
    """``Sampling`` from keyword options, an unknown one a ``ValueError`` naming the known ones."""
    known = {f.name for f in dataclasses.fields(Sampling)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"chat does not take {', '.join(map(repr, unknown))}; its options: {', '.join(sorted(known))}")
    return Sampling(**options)


class Chat(Task):
    name = "chat"
    description = "reply to a conversation (OpenAI-style messages, or a plain question) with a chat model"
    default_model = "chat-zh-tiny"
    models = ("chat-zh-tiny",)
    option_names = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty")
    sampling: Sampling

    def _construct_model(self, model: str) -> None:
        self.sampling = sampling_options(**self.options)
        self.rng = np.random.default_rng(self.sampling.seed)
        self._open(model)

    def _open(self, model: str) -> None:
        """The predictor on the exported graph and the model's own tokenizer (with its chat template)."""
        from sampan.inference import Config, create_predictor
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
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(self.eos)
        threads = self.num_threads or max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                          else os.cpu_count() or 1)
        self.predictor = create_predictor(Config(str(export_dir(model, directory)), backend=self.backend,
                                                 num_threads=threads, precision=self.precision, device=self.device))

    def __call__(self, inputs: Any) -> list[dict[str, Any]]:
        return self.reply(inputs)

    def reply(self, inputs: Any, **options: Any) -> list[dict[str, Any]]:
        """Replies to ``inputs`` (see ``conversations``), one dict per conversation; ``options``
        (``Sampling``'s fields) change the Taskflow's for this call only."""
        convs, _ = conversations(inputs)
        saved = self.sampling, self.rng
        if options:
            self.sampling = sampling_options(**{**dataclasses.asdict(self.sampling), **options})
            if "seed" in options:
                self.rng = np.random.default_rng(self.sampling.seed)
        try:
            results: list[dict[str, Any]] = []
            for start in range(0, len(convs), self.batch_size):
                batch = convs[start: start + self.batch_size]
                prepared = self._preprocess(batch)
                results.extend(self._postprocess(batch, prepared, self._run_model(prepared)))
            return results
        finally:
            # The Taskflow's own settings and sampler carry on; a call's seed starts a sampler of its own.
            self.sampling, self.rng = saved

    def _preprocess(self, convs: list[list[dict[str, str]]]) -> list[list[int]]:
        max_tokens = self.sampling.max_tokens
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

    def _next_logits(self, rows: Sequence[list[int]]) -> np.ndarray:
        # Right-padded: attention is causal, so padding after a row's end never reaches its logits.
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad, dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        (logits,) = self.predictor.run({"input_ids": ids})
        return np.stack([logits[i, len(r) - 1] for i, r in enumerate(rows)]).astype(np.float64)

    def _pick(self, logits: np.ndarray, history: list[int]) -> int:
        o = self.sampling
        logits = logits.copy()
        if o.repetition_penalty != 1.0 and history:
            seen = np.unique(np.asarray(history))
            logits[seen] = np.where(logits[seen] > 0, logits[seen] / o.repetition_penalty,
                                    logits[seen] * o.repetition_penalty)
        if o.temperature == 0:
            return int(np.argmax(logits))
        logits = logits / o.temperature
        if o.top_k:
            k = min(o.top_k, logits.size)
            logits[logits < np.partition(logits, -k)[-k]] = -np.inf
        order = np.argsort(-logits)
        probs = np.exp(logits[order] - logits[order[0]])
        probs /= probs.sum()
        # The nucleus: drop a token once the mass before it reaches top_p (the first always stays).
        keep = (np.cumsum(probs) - probs) < o.top_p
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
        return int(order[self.rng.choice(len(order), p=probs)])

    def _run_model(self, rows: list[list[int]]) -> list[tuple[list[int], str]]:
        rows = [list(r) for r in rows]
        new: list[list[int]] = [[] for _ in rows]
        finish = ["length"] * len(rows)
        live = list(range(len(rows)))
        for _ in range(self.sampling.max_tokens):
            if not live:
                break
            logits = self._next_logits([rows[i] for i in live])
            still = []
            for j, i in enumerate(live):
                token = self._pick(logits[j], rows[i])
                if token in self.eos:
                    finish[i] = "stop"
                    continue
                rows[i].append(token)
                new[i].append(token)
                still.append(i)
            live = still
        return list(zip(new, finish, strict=True))

    def _postprocess(self, convs: list[list[dict[str, str]]], inputs: Any,
                     outputs: list[tuple[list[int], str]]) -> list[dict[str, Any]]:
        return [{"reply": self.tokenizer.decode(ids, skip_special_tokens=True).strip(), "finish_reason": finish,
                 "messages": conv} for conv, (ids, finish) in zip(convs, outputs, strict=True)]

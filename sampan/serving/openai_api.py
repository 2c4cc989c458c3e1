"""The OpenAI-compatible endpoints: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``.

Each request becomes ``n`` sequences in the :class:`ChatEngine` (continuous batching); their
events come back through an asyncio queue. ``stream: true`` answers server-sent events
(``data: {chunk}\\n\\n`` ... ``data: [DONE]\\n\\n``), one chunk per piece of whole-character text.
A client that disconnects - streaming or not - cancels its sequences at once, which frees their
slots before the next decode step. Errors use OpenAI's shape (``errors.py``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from sampan.serving.chat_engine import ChatEngine, Event, QueueFull, SamplingParams, SequenceHandle
from sampan.serving.chat_model import ChatModel
from sampan.serving.config import ServingConfig
from sampan.serving.errors import ServingError
from sampan.serving.openai_schemas import MAX_STOPS, ChatCompletionRequest, CompletionRequest, _Sampling

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _check_common(body: _Sampling, chat: ChatModel, limits: ServingConfig) -> None:
    if body.model != chat.name:
        raise ServingError(404, "model_not_found", f"the model {body.model!r} does not exist here; this server "
                                                   f"serves {chat.name!r} (GET /v1/models)", param="model")
    if body.n > limits.chat_max_running:
        raise ServingError(400, "invalid_value", f"n={body.n} is more choices than the {limits.chat_max_running} "
                                                 "sequences that decode together (chat_max_running)", param="n")
    if len(body.stops()) > MAX_STOPS:
        raise ServingError(400, "invalid_value", f"stop holds {len(body.stops())} strings; at most {MAX_STOPS}",
                           param="stop")


def _max_tokens(asked: int | None, prompt_len: int, chat: ChatModel, limits: ServingConfig,
                prompt_field: str = "messages") -> int:
    """The new-token budget; a prompt (plus an explicit max_tokens) over the context is a 400 naming it."""
    context = chat.context_length
    if prompt_len >= context:
        raise ServingError(400, "context_length_exceeded",
                           f"this model's maximum context length is {context} tokens, and the prompt has "
                           f"{prompt_len}: shorten the prompt (the reply needs at least one more token)",
                           param=prompt_field)
    if asked is not None and prompt_len + asked > context:
        raise ServingError(400, "context_length_exceeded",
                           f"this model's maximum context length is {context} tokens; the prompt has {prompt_len} "
                           f"and max_tokens asks for {asked} more ({prompt_len + asked}): lower max_tokens or "
                           "shorten the prompt", param="max_tokens")
    return asked if asked is not None else min(limits.chat_max_tokens, context - prompt_len)


def _params(body: _Sampling, max_tokens: int) -> list[SamplingParams]:
    # Choice i samples with seed + i: n choices differ, and the same request repeats exactly.
    return [SamplingParams(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                           seed=None if body.seed is None else body.seed + i, stop=body.stops(),
                           ignore_eos=body.ignore_eos) for i in range(body.n)]


async def _wait_disconnect(request: Request) -> None:
    """Returns when the client has gone (the body was read already: the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class _Mailbox:
    """Events from the engine thread to the event loop, one wake-up per batch of them.

    A decode step of 32 sequences produces 32 events at once; waking the loop once for all of them
    (instead of one ``call_soon_threadsafe`` each, a pipe write apiece) keeps the loop's share of
    a step small.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue, Any]] = []
        self._scheduled = False

    def post(self, queue: asyncio.Queue, item: Any) -> None:
        with self._lock:
            self._items.append((queue, item))
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items, self._scheduled = self._items, [], False
        for queue, item in items:
            queue.put_nowait(item)


_MAILBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()


def _mailbox() -> _Mailbox:
    loop = asyncio.get_running_loop()
    if loop not in _MAILBOXES:
        _MAILBOXES[loop] = _Mailbox(loop)
    return _MAILBOXES[loop]


_GONE: Any = ("gone", None)  # put on a run's queue when its client disconnects


class _Run:
    """One request's sequences in the engine and the queue their events arrive on."""

    def __init__(self, engine: ChatEngine, prompt: list[int], params: list[SamplingParams]):
        mailbox = _mailbox()
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        def emitter(index: int):
            return lambda event: mailbox.post(self.queue, (index, event))

        try:
            self.handles: list[SequenceHandle] = engine.submit(prompt, params, [emitter(i) for i in range(len(params))])
        except QueueFull as error:
            raise ServingError(429, "queue_full", f"the server is at capacity: {error}; retry later") from None
        self.open = len(params)

    async def events(self, request: Request) -> AsyncIterator[list[tuple[int, Event]]]:
        """Events, in batches of those already arrived, until every sequence finished; stops early
        (cancelling them) if the client leaves."""

        async def watch() -> None:  # the disconnect arrives on the same queue as the events
            await _wait_disconnect(request)
            self.queue.put_nowait(_GONE)

        watcher = asyncio.ensure_future(watch())
        try:
            while self.open:
                batch = [await self.queue.get()]
                while not self.queue.empty():
                    batch.append(self.queue.get_nowait())
                if any(item is _GONE for item in batch):
                    return  # the client left
                self.open -= sum(event.finish_reason is not None for _, event in batch)
                yield batch
        finally:
            watcher.cancel()
            self.cancel()

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _text_chunk(base: dict, include_usage: bool, chat: bool):
    """The hot path: a function ``(index, text) -> SSE bytes`` for one piece of text, with the
    request's constant fields serialised once (one chunk per token per stream adds up)."""
    head = "data: " + json.dumps(base, ensure_ascii=False)[:-1] + ', "choices": [{"index": '
    tail = (', "logprobs": null, "finish_reason": null}]' + (', "usage": null' if include_usage else "") + "}\n\n")
    key = '"delta": {"content": ' if chat else '"text": '
    close = "}" if chat else ""

    def chunk(index: int, text: str) -> bytes:
        return f"{head}{index}, {key}{json.dumps(text, ensure_ascii=False)}{close}{tail}".encode()

    return chunk


def install_openai_routes(app: FastAPI, chat: ChatModel, engine: ChatEngine, limits: ServingConfig) -> None:
    """Add the three OpenAI endpoints for ``chat`` (served as ``chat.name``) to ``app``."""

    @app.get("/v1/models", summary="(OpenAI) the served chat model")
    async def list_models() -> dict:
        return {"object": "list", "data": [chat.info()]}

    @app.get("/v1/models/{model_id}", summary="(OpenAI) one model")
    async def get_model(model_id: str) -> dict:
        if model_id != chat.name:
            raise ServingError(404, "model_not_found", f"the model {model_id!r} does not exist here; this server "
                                                       f"serves {chat.name!r}", param="model")
        return chat.info()

    @app.post("/v1/chat/completions", summary="(OpenAI) a reply to a conversation, streamed or not")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
        _check_common(body, chat, limits)
        messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                    for m in body.messages]
        prompt = chat.chat_prompt(messages)
        asked = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        run = _Run(engine, prompt, _params(body, _max_tokens(asked, len(prompt), chat, limits)))
        meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": chat.name}
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(_chat_stream(run, request, meta, len(prompt), usage, body.n),
                                     media_type="text/event-stream", headers=_SSE_HEADERS)
        texts, reasons, tokens = await _collect(run, request, body.n)
        return {**meta, "object": "chat.completion",
                "choices": [{"index": i, "message": {"role": "assistant", "content": texts[i]},
                             "logprobs": None, "finish_reason": reasons[i]} for i in range(body.n)],
                "usage": _usage(len(prompt), sum(tokens))}

    @app.post("/v1/completions", summary="(OpenAI) a continuation of a prompt, streamed or not")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        _check_common(body, chat, limits)
        prompt = chat.text_prompt(body.prompt)
        if not prompt:
            raise ServingError(400, "invalid_prompt", "the prompt is empty; send some text (or token ids)",
                               param="prompt")
        run = _Run(engine, prompt, _params(body, _max_tokens(body.max_tokens, len(prompt), chat, limits, "prompt")))
        meta = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": chat.name}
        echo = (body.prompt if isinstance(body.prompt, str) else chat.tokenizer.decode(prompt)) if body.echo else ""
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return StreamingResponse(_completion_stream(run, request, meta, len(prompt), usage, body.n, echo),
                                     media_type="text/event-stream", headers=_SSE_HEADERS)
        texts, reasons, tokens = await _collect(run, request, body.n)
        return {**meta, "object": "text_completion",
                "choices": [{"index": i, "text": echo + texts[i], "logprobs": None, "finish_reason": reasons[i]}
                            for i in range(body.n)],
                "usage": _usage(len(prompt), sum(tokens))}


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _collect(run: _Run, request: Request, n: int) -> tuple[list[str], list[str | None], list[int]]:
    texts, reasons, tokens = [""] * n, [None] * n, [0] * n
    parts: list[list[str]] = [[] for _ in range(n)]
    async for batch in run.events(request):
        for index, event in batch:
            if event.finish_reason == "error":
                raise ServingError(500, "model_error", f"generation failed ({event.error}); it is logged and the "
                                                       "service keeps running")
            parts[index].append(event.text)
            tokens[index] = event.completion_tokens
            if event.finish_reason is not None:
                reasons[index] = event.finish_reason
    for i in range(n):
        texts[i] = "".join(parts[i])
    return texts, reasons, tokens


def _error_chunk(event: Event) -> bytes:
    return _sse({"error": {"message": f"generation failed ({event.error})", "type": "server_error", "param": None,
                           "code": "model_error"}})


async def _stream(run: _Run, request: Request, base: dict, prompt_len: int, include_usage: bool, n: int,
                  opening: list[bytes], chunks: Callable[[int, Event], list[bytes]]) -> AsyncIterator[bytes]:
    """The SSE loop both endpoints share: ``opening`` first, then each engine event as the endpoint's
    ``chunks(index, event)`` (the events that arrived together go out in one write), the usage
    chunk if asked, ``[DONE]``; an error event ends the stream with an error chunk."""
    tokens = [0] * n
    try:
        for first in opening:
            yield first
        async for batch in run.events(request):
            out: list[bytes] = []
            for index, event in batch:
                if event.finish_reason == "error":
                    yield b"".join(out) + _error_chunk(event)
                    return
                tokens[index] = event.completion_tokens
                out.extend(chunks(index, event))
            if out:
                yield b"".join(out)
        if include_usage:
            yield _sse({**base, "choices": [], "usage": _usage(prompt_len, sum(tokens))})
        yield b"data: [DONE]\n\n"
    finally:
        run.cancel()  # the client left mid-stream (the generator is closed): free the slots now


def _chat_stream(run: _Run, request: Request, meta: dict, prompt_len: int, include_usage: bool,
                 n: int) -> AsyncIterator[bytes]:
    base = {**meta, "object": "chat.completion.chunk"}
    extra = {"usage": None} if include_usage else {}
    text_chunk = _text_chunk(base, include_usage, chat=True)

    def chunks(index: int, event: Event) -> list[bytes]:
        out = [text_chunk(index, event.text)] if event.text else []
        if event.finish_reason is not None:
            out.append(_sse({**base, "choices": [{"index": index, "delta": {}, "logprobs": None,
                                                  "finish_reason": event.finish_reason}], **extra}))
        return out

    opening = [_sse({**base, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                          "logprobs": None, "finish_reason": None}], **extra}) for i in range(n)]
    return _stream(run, request, base, prompt_len, include_usage, n, opening, chunks)


def _completion_stream(run: _Run, request: Request, meta: dict, prompt_len: int, include_usage: bool,
                       n: int, echo: str) -> AsyncIterator[bytes]:
    base = {**meta, "object": "text_completion"}
    extra = {"usage": None} if include_usage else {}
    text_chunk = _text_chunk(base, include_usage, chat=False)

    def chunks(index: int, event: Event) -> list[bytes]:
        if event.finish_reason is not None:  # the last text rides on the finishing chunk
            return [_sse({**base, "choices": [{"index": index, "text": event.text, "logprobs": None,
                                               "finish_reason": event.finish_reason}], **extra})]
        return [text_chunk(index, event.text)] if event.text else []

    opening = ([_sse({**base, "choices": [{"index": i, "text": echo, "logprobs": None, "finish_reason": None}],
                      **extra}) for i in range(n)] if echo else [])
    return _stream(run, request, base, prompt_len, include_usage, n, opening, chunks)


__all__ = ["install_openai_routes"]

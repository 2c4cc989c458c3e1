"""``ChatEngine``: continuous batching of text generation over the eager torch model.

One engine thread owns the model. Each loop it

1. takes waiting sequences into free slots (at most ``max_running`` decode together) and runs
   their prefill - the newcomers' prompts in one left-padded forward - which gives each its first
   token at once (time to first token does not wait for the running batch to finish);
2. merges the newcomers' KV rows into the running batch (:class:`RowKVCache`), so they join the
   very next decode step;
3. runs one decode step over every running sequence (one token each, one batched forward);
4. lets sequences that finished (end of sequence, ``max_tokens``, a stop string) or whose client
   left (:meth:`SequenceHandle.cancel`) leave the batch before the next step.

A request arriving while others decode therefore waits at most one step, and a finished one frees
its slot at once. Sampling is per row with the sequence's own ``torch.Generator``, and padding is
masked exactly, so a reply does not depend on which other requests share its batch: under
concurrency it equals the same request sent alone (up to float rounding of batched kernels, which
never changed a token in the tests).

Events go back to each sequence's ``emit`` callback from the engine thread (the HTTP layer hands
them to its event loop with ``call_soon_threadsafe``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sampan.models.generation import filter_top_k_top_p
from sampan.serving.batch_cache import RowKVCache
from sampan.serving.text_stream import TextStream

log = logging.getLogger("sampan.serving")


@dataclass(frozen=True)
class SamplingParams:
    """How one sequence is generated.

    Fields:
        max_tokens: most new tokens (the end-of-sequence token included).
        temperature: 0 = greedy (argmax); otherwise sample from ``softmax(logits / temperature)``.
        top_p: sample from the smallest set of tokens whose probability reaches ``top_p``.
        seed: seeds this sequence's own generator (None: a random seed), so a seeded sample is
            the same alone or in any batch.
        stop: strings that end the reply (not included in it).
        ignore_eos: keep generating past the end-of-sequence token (benchmarks, tests).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False


@dataclass
class Event:
    """What a sequence produced in one step: new text, and the reason it ended (None while running)."""

    text: str
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    completion_tokens: int = 0
    error: str | None = None


class QueueFull(Exception):
    """More sequences than ``max_waiting`` would wait for a slot."""


@dataclass
class _Sequence:
    prompt: list[int]
    params: SamplingParams
    emit: Callable[[Event], None]
    stream: TextStream
    generator: torch.Generator | None
    generated: int = 0
    last: int = 0  # the last token, the next decode step's input
    cancelled: bool = False
    done: bool = False
    enqueued: float = field(default_factory=time.perf_counter)


class SequenceHandle:
    """The HTTP side's grip on one sequence: cancel it when the client goes away."""

    def __init__(self, engine: ChatEngine, seq: _Sequence):
        self._engine, self._seq = engine, seq

    def cancel(self) -> None:
        """Free the sequence's slot before the next step (or take it off the waiting queue)."""
        if not self._seq.done:
            self._seq.cancelled = True
            self._engine._wake()


class ChatEngine:
    """Continuous batching over ``model`` (a sampan causal LM with ``kv_cache`` support).

    Args:
        model: the eager model (``forward(input_ids, attention_mask, position_ids, kv_cache=...)``).
        tokenizer: decodes tokens into text (``decode(ids, skip_special_tokens)``).
        num_layers: the model's decoder layers (the cache keeps one buffer per layer).
        eos_ids: tokens that end a reply.
        pad_id: the token fed at padding positions (masked out; any valid id works).
        max_running: sequences decoding together (the batch size of a step).
        max_waiting: sequences allowed to wait for a slot; :meth:`submit` raises ``QueueFull`` above it.
        on_change: called with ``(running, waiting)`` after each change (metrics).
        on_step: called with ``(rows, seconds)`` after each decode step (metrics).
    """

    def __init__(self, model: torch.nn.Module, tokenizer, num_layers: int, eos_ids: list[int], pad_id: int = 0, *,
                 max_running: int = 32, max_waiting: int = 256,
                 on_change: Callable[[int, int], None] | None = None,
                 on_step: Callable[[int, float], None] | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.num_layers = num_layers
        self.eos_ids = set(eos_ids)
        self.pad_id = pad_id
        self.max_running = max_running
        self.max_waiting = max_waiting
        self._on_change = on_change
        self._on_step = on_step
        self._device = next(model.parameters()).device
        self._cond = threading.Condition()
        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._cache = RowKVCache(num_layers)
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.steps = 0  # decode steps run (tests read it)
        self.max_batch_seen = 0

    # -- the HTTP side ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._stopped = False
            self._thread = threading.Thread(target=self._loop, name="sampan-chat-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        for seq in [*self._waiting, *self._running]:
            self._finish(seq, "error", error="the service is shutting down")
        self._waiting.clear()
        self._running.clear()

    def submit(self, prompt: list[int], params: list[SamplingParams],
               emit: list[Callable[[Event], None]]) -> list[SequenceHandle]:
        """Queue one sequence per ``params`` (a request's ``n`` choices) for ``prompt``; all or none."""
        seqs = []
        for p, e in zip(params, emit, strict=True):
            generator = None
            if p.temperature > 0:
                generator = torch.Generator(device=self._device)
                generator.manual_seed(p.seed if p.seed is not None else random.getrandbits(63))
            seqs.append(_Sequence(list(prompt), p, e, TextStream(self.tokenizer, p.stop), generator))
        with self._cond:
            if self._stopped:
                raise RuntimeError("the chat engine is stopped")
            waiting = sum(not s.cancelled for s in self._waiting)
            if waiting + len(seqs) > self.max_waiting:
                raise QueueFull(f"{waiting} sequences already wait for one of {self.max_running} slots "
                                f"(chat_max_waiting {self.max_waiting})")
            self._waiting.extend(seqs)
            self._cond.notify_all()
        self._changed()
        return [SequenceHandle(self, s) for s in seqs]

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(len(self._running), len(self._waiting))

    # -- the engine thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self._waiting and not self._running:
                    self._cond.wait()
                if self._stopped:
                    return
                if any(s.cancelled for s in self._waiting):  # clients that left while waiting
                    for seq in [s for s in self._waiting if s.cancelled]:
                        self._finish(seq, "cancelled")
                    self._waiting = deque(s for s in self._waiting if not s.cancelled)
                admitted = []
                while self._waiting and len(self._running) + len(admitted) < self.max_running:
                    seq = self._waiting.popleft()
                    if seq.cancelled:
                        self._finish(seq, "cancelled")
                    else:
                        admitted.append(seq)
            try:
                self._leave([s for s in self._running if s.cancelled or s.done])
                if admitted:
                    self._prefill(admitted)
                if self._running:
                    self._decode()
            except Exception as error:  # noqa: BLE001 - the engine outlives a failed step; its sequences fail
                log.exception("chat engine step failed; its sequences end with an error")
                for seq in [*self._running, *admitted]:
                    self._finish(seq, "error", error=f"{type(error).__name__}: {error}")
                self._running, self._cache = [], RowKVCache(self.num_layers)
            self._changed()

    @torch.no_grad()
    def _prefill(self, seqs: list[_Sequence]) -> None:
        """The newcomers' prompts in one left-padded forward; each gets its first token, then joins."""
        width = max(len(s.prompt) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        real = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, seq in enumerate(seqs):
            ids[row, width - len(seq.prompt):] = torch.tensor(seq.prompt, dtype=torch.long)
            real[row, width - len(seq.prompt):] = 1
        cache = RowKVCache.empty(self.num_layers, len(seqs), self._device)
        logits = self._forward(ids.to(self._device), real.to(self._device), cache)
        self._cache.merge(cache)
        self._running.extend(seqs)
        self._accept(seqs, logits)

    @torch.no_grad()
    def _decode(self) -> None:
        """One token for every running sequence."""
        rows = self._running
        start = time.perf_counter()
        ids = torch.tensor([[s.last] for s in rows], dtype=torch.long, device=self._device)
        logits = self._forward(ids, torch.ones_like(ids), self._cache)
        if self._on_step is not None:
            self._on_step(len(rows), time.perf_counter() - start)
        self.steps += 1
        self.max_batch_seen = max(self.max_batch_seen, len(rows))
        self._accept(rows, logits)

    def _forward(self, ids: torch.Tensor, real: torch.Tensor, cache: RowKVCache) -> torch.Tensor:
        """The last position's logits ``[rows, vocab]`` (float32)."""
        mask, positions = cache.open_columns(real)
        model = self.model
        if hasattr(model, "lm_head") and hasattr(model, "model"):
            # The LM head on the last position only: a long prompt never makes [s, vocab] logits.
            hidden = model.model(ids, mask, positions, cache)
            logits = model.lm_head(hidden[:, -1])
        else:
            logits = model(ids, attention_mask=mask, position_ids=positions, kv_cache=cache)[:, -1]
        cache.close_columns(real)
        return logits.float()

    def _accept(self, seqs: list[_Sequence], logits: torch.Tensor) -> None:
        """Pick each sequence's next token (``logits`` row i is ``seqs[i]``'s), send its text, and let
        finished ones leave."""
        greedy = logits.argmax(dim=-1).tolist()
        finished = []
        for row, seq in enumerate(seqs):
            p = seq.params
            if p.temperature > 0:
                row_logits = filter_top_k_top_p(logits[row:row + 1] / p.temperature, 0, p.top_p)
                token = int(torch.multinomial(row_logits.softmax(-1), 1, generator=seq.generator))
            else:
                token = greedy[row]
            seq.generated += 1
            seq.last = token
            if seq.cancelled:
                finished.append(seq)
                continue
            if token in self.eos_ids and not p.ignore_eos:
                self._finish(seq, "stop")
            else:
                text, stopped = seq.stream.push(token)
                if stopped:
                    self._finish(seq, "stop", text)
                elif seq.generated >= p.max_tokens:
                    self._finish(seq, "length", text)
                elif text:
                    _send(seq, Event(text, None, seq.generated))
            if seq.done:
                finished.append(seq)
        self._leave(finished)

    def _leave(self, seqs: list[_Sequence]) -> None:
        if not seqs:
            return
        for seq in seqs:
            if not seq.done:
                self._finish(seq, "cancelled")
        gone = {id(s) for s in seqs}
        keep = [i for i, s in enumerate(self._running) if id(s) not in gone]
        self._running = [self._running[i] for i in keep]
        self._cache.keep(keep)

    def _finish(self, seq: _Sequence, reason: str, text: str = "", error: str | None = None) -> None:
        if seq.done:
            return
        seq.done = True
        if reason in ("stop", "length"):
            text += seq.stream.flush()
        _send(seq, Event(text, reason, seq.generated, error))


def _send(seq: _Sequence, event: Event) -> None:
    try:
        seq.emit(event)
    except Exception:  # noqa: BLE001 - a gone client's callback (its event loop closed) must not stop the engine
        seq.cancelled = True
        log.debug("could not deliver an event; the sequence is cancelled", exc_info=True)


__all__ = ["ChatEngine", "Event", "QueueFull", "SamplingParams", "SequenceHandle"]

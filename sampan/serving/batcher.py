"""Dynamic batching: concurrent requests to one task or model share one model call.

Each task / model has an asyncio queue and one worker coroutine. The worker takes the first
waiting request, lets others join for up to ``max_wait_ms`` or until ``max_batch_size`` inputs,
and runs the batched call on its own thread (the call is synchronous and CPU-bound; running it
on the event loop would stall every other request, ``/healthz`` included). Results are split back
to their requests. While a batch runs, new requests queue up and form the next batch, so under
load batches fill without waiting.

A failing batch never kills the worker: if a batch of several requests raises, each request is
rerun alone so only the one at fault gets the error (and its error's input index is its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sampan.serving.errors import ServingError
from sampan.serving.metrics import ServingMetrics

log = logging.getLogger("sampan.serving")

BatchFn = Callable[[Sequence[Any]], list[Any]]
"""Runs a batch: one payload per request in, one result per request out (same order)."""


@dataclass
class _Pending:
    payload: Any
    size: int
    future: asyncio.Future = field(repr=False)


class _Failed:
    """A per-request exception carried back from the worker thread."""

    def __init__(self, error: BaseException):
        self.error = error


class DynamicBatcher:
    """Groups requests to one target into batched calls of ``fn`` on a dedicated worker thread.

    Args:
        name: the task or model name (metric label, thread name).
        fn: the batched call, see :data:`BatchFn`.
        max_batch_size: most inputs per call; a single request larger than this runs alone.
        max_wait_ms: how long a batch's first request waits for company.
        max_queue_inputs: inputs allowed to wait; more are refused with 503.
        metrics: where batch sizes, batch times and queue depth are recorded.
    """

    def __init__(self, name: str, fn: BatchFn, *, max_batch_size: int, max_wait_ms: float,
                 max_queue_inputs: int, metrics: ServingMetrics | None = None):
        self.name = name
        self._fn = fn
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue_inputs = max_queue_inputs
        self._metrics = metrics
        self._queue: asyncio.Queue[_Pending] | None = None
        self._carry: _Pending | None = None  # a request that did not fit the last batch; it opens the next
        self._queued = 0
        self._worker: asyncio.Task | None = None
        self._stopped = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sampan-batch-{name}")
        self.batches_run = 0

    async def start(self) -> None:
        """Start the worker on the running event loop (idempotent)."""
        if self._worker is None:
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.name}")

    async def stop(self) -> None:
        """Stop the worker; waiting requests get a 503."""
        self._stopped = True
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        pending = [self._carry] if self._carry else []
        while self._queue is not None and not self._queue.empty():
            pending.append(self._queue.get_nowait())
        for item in pending:
            if not item.future.done():
                item.future.set_exception(ServingError(503, "shutting_down", "the service is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, payload: Any, size: int, timeout_s: float) -> Any:
        """Queue one request of ``size`` inputs and wait for its result (504 after ``timeout_s``)."""
        if self._stopped:
            raise ServingError(503, "shutting_down", f"'{self.name}' is shutting down; retry on another replica")
        if self._worker is None:  # an ASGI host that skips the lifespan (e.g. a test client) starts it here
            await self.start()
        assert self._queue is not None
        if self._queued + size > self.max_queue_inputs:
            raise ServingError(503, "overloaded", f"'{self.name}' already has {self._queued} inputs waiting "
                                                  f"(limit {self.max_queue_inputs}); retry later")
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(payload, size, future))
        self._set_queued(self._queued + size)
        try:
            result = await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            # wait_for cancelled the future; the worker skips cancelled requests it has not started.
            raise ServingError(504, "timeout", f"'{self.name}' did not answer within {timeout_s:g} s "
                                               "(request_timeout_s); the service is overloaded or the "
                                               "input is too large") from None
        if isinstance(result, _Failed):
            raise result.error
        return result

    def _set_queued(self, value: int) -> None:
        self._queued = value
        if self._metrics is not None:
            self._metrics.queue_depth.labels(self.name).set(value)

    async def _next(self) -> _Pending:
        if self._carry is not None:
            item, self._carry = self._carry, None
            return item
        assert self._queue is not None
        return await self._queue.get()

    async def _collect(self) -> list[_Pending]:
        """One batch: the first live request, then others until the batch is full or the wait is over."""
        loop = asyncio.get_running_loop()
        first = await self._next()
        batch, size = [first], first.size
        deadline = loop.time() + self.max_wait_s
        while size < self.max_batch_size:
            if self._carry is not None:
                break
            assert self._queue is not None
            if self._queue.empty():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    item = await asyncio.wait_for(self._queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            else:
                item = self._queue.get_nowait()
            if size + item.size > self.max_batch_size:
                self._carry = item
                break
            batch.append(item)
            size += item.size
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                batch = await self._collect()
                self._set_queued(self._queued - sum(p.size for p in batch))
                live = [p for p in batch if not p.future.done()]  # drop requests that timed out or left
                if not live:
                    continue
                start = time.perf_counter()
                results = await loop.run_in_executor(self._executor, self._run, [p.payload for p in live])
                if self._metrics is not None:
                    self._metrics.batch_size.labels(self.name).observe(sum(p.size for p in live))
                    self._metrics.batch_latency.labels(self.name).observe(time.perf_counter() - start)
                self.batches_run += 1
                for pending, result in zip(live, results, strict=True):
                    if not pending.future.done():
                        pending.future.set_result(result)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the worker must outlive any batch; the batch's requests get a 500
                log.exception("batch worker for %s failed; continuing", self.name)
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(ServingError(
                            500, "internal_error", f"the batch for '{self.name}' failed; it is logged"))

    def _run(self, payloads: list[Any]) -> list[Any]:
        """On the worker thread: the batched call, or one call per request if the batch fails."""
        try:
            results = self._fn(payloads)
            if len(results) != len(payloads):
                raise RuntimeError(f"'{self.name}' returned {len(results)} results for {len(payloads)} requests")
            return results
        except Exception as error:  # noqa: BLE001 - isolate the request at fault, below
            if len(payloads) == 1:
                return [_Failed(error)]
        out: list[Any] = []
        for payload in payloads:
            try:
                out.extend(self._fn([payload]))
            except Exception as error:  # noqa: BLE001 - this request's own failure, answered to it alone
                out.append(_Failed(error))
        return out

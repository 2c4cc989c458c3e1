"""Raw ASGI middleware in front of FastAPI: the body-size limit and per-request metrics.

The body is read here, up to ``max_body_bytes``, before any parsing: a larger one (by its
Content-Length, or counted as it streams in when chunked) is answered 413 without buffering the
rest. The buffered body is then replayed to the app.
"""

from __future__ import annotations

import time
from typing import Any

from sampan.serving.errors import error_bytes, is_openai_path
from sampan.serving.metrics import ServingMetrics

Scope = dict[str, Any]


class LimitsAndMetricsMiddleware:
    """Enforce ``max_body_bytes`` and record each request's endpoint, status and latency.

    ``path_limits`` gives some paths a limit of their own, as ``{path: (bytes, setting name)}``
    (``/v1/tasks/ocr`` takes images, far larger than texts).
    """

    def __init__(self, app: Any, *, max_body_bytes: int, metrics: ServingMetrics,
                 path_limits: dict[str, tuple[int, str]] | None = None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500}

        async def send_recording(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        limit, setting = self.path_limits.get(scope["path"], (self.max_body_bytes, "max_body_bytes"))
        try:
            body = await self._read_body(scope, receive, limit)
            if body is None:
                await _send_json(send_recording, 413, "body_too_large",
                                 f"the request body is larger than {limit} bytes ({setting}); "
                                 "send fewer or smaller inputs per request", is_openai_path(scope["path"]))
                return
            await self.app(scope, _replay(body, receive), send_recording)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            self.metrics.observe_request(endpoint, scope["method"], status["code"], time.perf_counter() - start)

    async def _read_body(self, scope: Scope, receive: Any, limit: int) -> bytes | None:
        """The whole body, or None once it is known to exceed ``limit``."""
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    if int(value) > limit:
                        await _drain(receive)
                        return None
                except ValueError:
                    pass  # uvicorn's parser rejects a bad Content-Length before we run
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                if message.get("more_body", False):
                    await _drain(receive)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


# A client that keeps sending after the limit is read to the end (and discarded) before the 413, so it
# sees the answer instead of a reset connection; past this much it is cut off.
_DRAIN_LIMIT = 64 * 1024 * 1024


async def _drain(receive: Any) -> None:
    drained = 0
    while drained < _DRAIN_LIMIT:
        message = await receive()
        if message["type"] != "http.request":
            return
        drained += len(message.get("body", b""))
        if not message.get("more_body", False):
            return


def _replay(body: bytes, receive: Any) -> Any:
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as the server would report it

    return replay


async def _send_json(send: Any, status: int, code: str, message: str, openai: bool = False) -> None:
    payload = error_bytes(code, message, status, openai)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": payload})

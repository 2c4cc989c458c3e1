"""``ServingConfig``: the limits and knobs of one ``sampan serve`` process, typed and checked."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class ServingConfig:
    """Limits, batching and binding of the HTTP service (``sampan serve`` flags map one to one)."""

    max_batch_size: int = 32
    """Most inputs one batched model call takes; 1 turns dynamic batching off."""
    max_wait_ms: float = 5.0
    """How long the first request of a batch waits for others to join it before the batch runs."""
    max_body_bytes: int = 1_048_576
    """Largest request body accepted (bytes); a larger one is answered 413 before it is parsed."""
    max_inputs_per_request: int = 64
    """Most entries in one request's ``inputs`` list (413 above it)."""
    max_text_chars: int = 2_000
    """Longest single text accepted (characters; 413 above it) - the models truncate long before this."""
    max_image_bytes: int = 16_777_216
    """Largest request body on ``/v1/tasks/ocr`` (bytes; 413 above it): the image file itself, or the
    JSON holding base64 images (base64 is 4/3 of the file). Other endpoints keep ``max_body_bytes``."""
    max_image_pixels: int = 25_000_000
    """Most pixels (width x height) of one uploaded image, read from its header before it is decoded
    (413 above it): a decompression bomb is refused without being decoded."""
    max_images_per_request: int = 4
    """Most images in one ``/v1/tasks/ocr`` request (413 above it)."""
    request_timeout_s: float = 30.0
    """A request still waiting for its result after this many seconds is answered 504."""
    max_queue_inputs: int = 4_096
    """Inputs waiting per task / model before new requests are refused with 503 (back-pressure)."""
    chat_max_running: int = 32
    """Chat sequences (a request's ``n`` choices each count) that decode together in one batch."""
    chat_max_waiting: int = 256
    """Chat sequences that may wait for a free slot; a request that would exceed it is answered 429."""
    chat_max_tokens: int = 512
    """New tokens per chat choice when the request gives no ``max_tokens`` (the context caps it too)."""
    host: str = "127.0.0.1"
    """Address to bind; loopback unless told otherwise (0.0.0.0 exposes the service to the network)."""
    port: int = 8866
    """TCP port to listen on."""

    def __post_init__(self) -> None:
        positive = ("max_batch_size", "max_body_bytes", "max_inputs_per_request", "max_text_chars",
                    "max_image_bytes", "max_image_pixels", "max_images_per_request", "max_queue_inputs", "chat_max_running", "chat_max_tokens")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ServingConfig.{name} must be a positive integer, got {value!r}")
        if not isinstance(self.chat_max_waiting, int) or isinstance(self.chat_max_waiting, bool) \
                or self.chat_max_waiting < 0:
            raise ValueError(f"ServingConfig.chat_max_waiting must be an integer >= 0, got {self.chat_max_waiting!r}")
        if not self.max_wait_ms >= 0:
            raise ValueError(f"ServingConfig.max_wait_ms must be >= 0, got {self.max_wait_ms!r}")
        if not self.request_timeout_s > 0:
            raise ValueError(f"ServingConfig.request_timeout_s must be > 0, got {self.request_timeout_s!r}")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"ServingConfig.port must be an integer in 0..65535, got {self.port!r}")
        if not self.host:
            raise ValueError("ServingConfig.host must not be empty (use 127.0.0.1 for loopback)")

    def to_dict(self) -> dict:
        """The settings as a plain dict (shown by ``GET /v1/tasks`` under ``limits``)."""
        return dataclasses.asdict(self)

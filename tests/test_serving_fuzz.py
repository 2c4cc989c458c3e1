"""Fuzz a real `sampan serve` process with >= 1,000 malformed requests (hypothesis).

Every answer must be a 4xx with the JSON error shape, the process must stay up, and afterwards
``/healthz`` and a well-formed request must still work. Requests are malformed by construction
(random bytes, random JSON, near-misses of the schema, wrong methods / content types / routes);
any example that happens to be a valid request is discarded with ``assume`` so the check stays exact.
"""

from __future__ import annotations

import json
import string
from urllib.parse import quote

import httpx
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import sampan
from sampan.serving.launcher import ServerProcess
from sampan.static import InputSpec

TASK = "sentiment_analysis"
MAX_INPUTS, MAX_CHARS, MAX_BODY = 8, 64, 16_384
EXAMPLES = 1_100  # >= 1,000 requests; about 15-30 s against the local server on 2 shared cores


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The same seeded model and folder as test_serving.py's, so a session exports it once (10-20 s).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()
    folder = tmp_path_factory.getbasetemp() / "serving_tiny_model"
    if not (folder / "inference.json").is_file():
        sampan.jit.save(model, folder / "inference", input_spec=[InputSpec([None, 4], "float32", "x")])
    args = ["--task", TASK, "--model-dir", f"lin={folder}", "--max-inputs-per-request", str(MAX_INPUTS),
            "--max-text-chars", str(MAX_CHARS), "--max-body-bytes", str(MAX_BODY), "--log-level", "critical"]
    with ServerProcess(args) as proc:
        yield proc


# ------------------------------------------------------------------------------- what "valid" means


def _valid_task_body(body: object) -> bool:
    if not isinstance(body, dict) or set(body) != {"inputs"} or not isinstance(body["inputs"], list):
        return False
    texts = body["inputs"]
    if not 1 <= len(texts) <= MAX_INPUTS:
        return False
    for text in texts:
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_CHARS:
            return False
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return False
    return True


def _valid_model_body(body: object) -> bool:
    if not isinstance(body, dict) or set(body) != {"inputs"} or not isinstance(body["inputs"], dict):
        return False
    if set(body["inputs"]) != {"x"} or not isinstance(body["inputs"]["x"], list) or not body["inputs"]["x"]:
        return False
    rows = body["inputs"]["x"]
    return all(isinstance(r, list) and len(r) == 4 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                           and abs(v) < 1e30 for v in r) for r in rows)


def _parses(raw: bytes) -> tuple[bool, object]:
    try:
        return True, json.loads(raw)
    except (ValueError, RecursionError):
        return False, None


# ------------------------------------------------------------------------------------- strategies

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
_json = st.recursive(_json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                           st.dictionaries(st.text(max_size=8), inner, max_size=5)),
                     max_leaves=20)
_text = st.text(max_size=12)
_bad_text = st.one_of(st.just(""), st.sampled_from([" ", "\t\n", "\u3000"]), st.text(min_size=MAX_CHARS + 1,
                                                                                     max_size=MAX_CHARS + 40))
_bad_item = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.lists(_text, max_size=2),
                      st.dictionaries(_text, _text, max_size=2), _bad_text)


@st.composite
def _task_near_miss(draw) -> object:
    """Bodies shaped almost like {"inputs": [texts]} with one thing wrong."""
    kind = draw(st.sampled_from(["bad_item", "not_list", "empty", "too_many", "extra_key", "wrong_key", "top"]))
    good = draw(st.lists(st.text(alphabet="今天天气真好服务很差abc", min_size=1, max_size=5), max_size=3))
    if kind == "bad_item":
        items = [*good]
        items.insert(draw(st.integers(0, len(items))), draw(_bad_item))
        return {"inputs": items}
    if kind == "not_list":
        return {"inputs": draw(st.one_of(_json_leaf, st.dictionaries(_text, _text, max_size=3)))}
    if kind == "empty":
        return {"inputs": []}
    if kind == "too_many":
        return {"inputs": ["好"] * draw(st.integers(MAX_INPUTS + 1, MAX_INPUTS + 30))}
    if kind == "extra_key":
        return {"inputs": good or ["好"], draw(st.text(min_size=1, max_size=8).filter(lambda k: k != "inputs")):
                draw(_json_leaf)}
    if kind == "wrong_key":
        return {draw(st.sampled_from(["input", "Inputs", "texts", "data", ""])): good or ["好"]}
    return draw(st.one_of(_json_leaf, st.lists(_text, max_size=3)))


@st.composite
def requests(draw) -> tuple[str, str, dict, bytes]:
    """(method, path, headers, body) that the service must refuse with a 4xx."""
    json_headers = {"content-type": "application/json"}
    task_path, model_path = f"/v1/tasks/{TASK}", "/v1/models/lin/predict"
    kind = draw(st.sampled_from(["bytes", "json", "near_miss", "surrogate", "unknown_task", "model", "method",
                                 "content_type", "too_big"]))
    if kind == "bytes":  # arbitrary bytes, usually not JSON at all
        raw = draw(st.binary(max_size=200))
        ok, parsed = _parses(raw)
        assume(not (ok and _valid_task_body(parsed)))
        return "POST", task_path, json_headers, raw
    if kind == "json":
        body = draw(_json)
        assume(not _valid_task_body(body))
        return "POST", task_path, json_headers, json.dumps(body).encode()
    if kind == "near_miss":
        body = draw(_task_near_miss())
        assume(not _valid_task_body(body))
        return "POST", task_path, json_headers, json.dumps(body, ensure_ascii=draw(st.booleans())).encode()
    if kind == "surrogate":  # a JSON escape for half a UTF-16 pair: valid JSON, not valid text
        low = draw(st.integers(0xD800, 0xDFFF))
        return "POST", task_path, json_headers, f'{{"inputs": ["好\\u{low:04x}"]}}'.encode()
    if kind == "unknown_task":
        name = draw(st.text(alphabet=string.ascii_letters + string.digits + "_-.~中文", min_size=1, max_size=20))
        assume(name != TASK and name not in (".", ".."))
        return "POST", f"/v1/tasks/{quote(name, safe='')}", json_headers, '{"inputs": ["今天天气真好"]}'.encode()
    if kind == "model":
        body = draw(st.one_of(_json, st.fixed_dictionaries({"inputs": st.dictionaries(
            st.sampled_from(["x", "y", "input_ids"]), st.one_of(_json, st.lists(st.lists(
                st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70), _text),
                max_size=6), max_size=3)), max_size=2)})))
        assume(not _valid_model_body(body))
        return "POST", model_path, json_headers, json.dumps(body).encode()
    if kind == "method":
        method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]))
        return method, draw(st.sampled_from([task_path, model_path])), json_headers, '{"inputs": ["好"]}'.encode()
    if kind == "content_type":
        ctype = draw(st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                      "application/xml", "image/png"]))
        return "POST", task_path, {"content-type": ctype}, '{"inputs": ["今天天气真好"]}'.encode()
    size = draw(st.integers(MAX_BODY + 1, MAX_BODY * 4))  # too_big: over max_body_bytes
    return "POST", task_path, json_headers, json.dumps({"inputs": ["好" * (size // 3)]}).encode()


def test_malformed_requests_all_get_a_json_4xx_and_the_server_survives(server):
    sent: list[int] = []
    with httpx.Client(base_url=server.url, timeout=30) as client:

        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                         HealthCheck.data_too_large])
        @given(request=requests())
        def fuzz(request):
            method, path, headers, body = request
            response = client.request(method, path, headers=headers, content=body)
            sent.append(response.status_code)
            assert 400 <= response.status_code < 500, (method, path, body[:200], response.status_code, response.text)
            error = response.json()["error"]
            assert isinstance(error["code"], str) and error["code"]
            assert isinstance(error["message"], str) and error["message"]

        fuzz()

        assert len(sent) >= 1_000, f"only {len(sent)} requests were sent"
        assert server.alive(), server.log_text()[-3000:]
        assert client.get("/healthz").json()["status"] == "ok"
        good = client.post(f"/v1/tasks/{TASK}", json={"inputs": ["今天天气真好"]})
        assert good.status_code == 200 and good.json()["outputs"][0]["label"] in ("positive", "negative")
        # Every refusal was counted under its route template, none as a 5xx.
        metrics = client.get("/metrics").text
        assert 'status="5' not in metrics

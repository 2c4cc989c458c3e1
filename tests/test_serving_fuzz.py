"""Fuzz a real `sampan serve` process with >= 1,000 malformed requests (hypothesis), and probe each
size limit at the limit and one past it.

Every malformed request belongs to one *kind*, and each kind has ONE status the server must answer
(and the error codes it may carry, in the JSON error shape): a 413 where a 422 belongs, or a 400
where a 415 belongs, fails. The process must stay up, and afterwards ``/healthz`` and a well-formed
request must still work. Requests are malformed by construction (random bytes, random JSON,
near-misses of the schema, wrong methods / content types / routes); any example that happens to be
a valid request is discarded with ``assume`` so the check stays exact.

The OpenAI-compatible endpoints of a chat model (``--model``) are fuzzed the same way: malformed
chat / completion requests must each get their one status in OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``) and never reach the model.

Image uploads to ``/v1/tasks/ocr``, ``/v1/tasks/layout`` and ``/v1/tasks/document`` (the tiny OCR pair
of ``tests/ocr_tiny.py``, whose build and export the session shares, and the tiny detector of
``tests/layout_tiny.py``) are fuzzed too, each request sent to one of the three: random bytes, truncated PNGs, headers claiming more pixels than
``max_image_pixels``, zero-size images, wrong content types, too many and too large uploads.

The limits themselves are checked at the boundary: a request exactly at ``max_inputs_per_request``,
``max_text_chars`` or ``max_body_bytes`` (by Content-Length and chunked) is answered 200, and one
unit past it 413 - so an off-by-one (``>=`` for ``>``) in a limit check fails here
(``python -m tests.mutants.run --only inputs-limit-off-by-one`` and the other ``*-off-by-one``).
"""

from __future__ import annotations

import dataclasses
import json
import string
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import sampan
from sampan.server_process import ServerProcess
from sampan.serving.config import ServingConfig
from sampan.static import InputSpec
from tests.layout_tiny import build_tiny_detector
from tests.ocr_tiny import build_tiny_ocr, png_header
from tests.tiny_chat_model import build_chat_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

TASK = "sentiment_analysis"
# The limits the server runs with: ServingConfig fields, each passed as its `sampan serve` flag. Small,
# so that the fuzz reaches them cheaply; the boundary tests read them back from GET /v1/tasks.
LIMITS = {"max_inputs_per_request": 8, "max_text_chars": 64, "max_body_bytes": 16_384, "max_image_bytes": 65_536,
          "max_image_pixels": 100_000, "max_images_per_request": 2}
MAX_INPUTS, MAX_CHARS, MAX_BODY = (LIMITS[k] for k in ("max_inputs_per_request", "max_text_chars",
                                                        "max_body_bytes"))
EXAMPLES = 1_100  # >= 1,000 requests; about 15-30 s against the local server on 2 shared cores
JSON_HEADERS = {"content-type": "application/json"}
TASK_PATH, MODEL_PATH, OCR_PATH = f"/v1/tasks/{TASK}", "/v1/models/lin/predict", "/v1/tasks/ocr"
IMAGE_PATHS = (OCR_PATH, "/v1/tasks/layout", "/v1/tasks/document")  # one upload code, three tasks
MAX_IMAGE_BYTES, MAX_PIXELS, MAX_IMAGES = (LIMITS[k] for k in ("max_image_bytes", "max_image_pixels",
                                                               "max_images_per_request"))
CHAT_PATH, COMPLETION_PATH, CHAT_MODEL, CHAT_CONTEXT = "/v1/chat/completions", "/v1/completions", "tiny-chat", 64

assert set(LIMITS) <= {f.name for f in dataclasses.fields(ServingConfig)}, "LIMITS names a non-existent setting"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # The same seeded model and folder as test_serving.py's, so a session exports it once (10-20 s).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()).eval()
    folder = tmp_path_factory.getbasetemp() / "serving_tiny_model"
    if not (folder / "inference.json").is_file():
        sampan.jit.save(model, folder / "inference", input_spec=[InputSpec([None, 4], "float32", "x")])
    chat = build_chat_model_dir(tmp_path_factory.mktemp("fuzz_chat") / "tiny", context=CHAT_CONTEXT, train_steps=0)
    # OCR on the tiny memorised pair (tests/ocr_tiny.py); its export is shared through that home
    ocr = build_tiny_ocr(tmp_path_factory.getbasetemp() / "ocr_tiny")
    detector = build_tiny_detector(tmp_path_factory.mktemp("fuzz_layout") / "det")
    args = ["--task", TASK, "--model-dir", f"lin={folder}", "--model", str(chat), "--served-model-name", CHAT_MODEL,
            "--task", "ocr", "--task-option", f"ocr.det_model={ocr.det}", "--task-option", f"ocr.rec_model={ocr.rec}",
            "--task", "layout", "--task-option", f"layout.model={detector}",
            "--task", "document", "--task-option", f"document.model={detector}",
            "--task-option", f"document.det_model={ocr.det}", "--task-option", f"document.rec_model={ocr.rec}",
            "--device", "cpu", "--log-level", "critical"]
    for name, value in LIMITS.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    with ServerProcess(args, env={"SAMPAN_HOME": str(ocr.home)}) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def limits(client) -> dict:
    """The limits in force, as the server reports them (and they are the ones it was started with)."""
    reported = client.get("/v1/tasks").json()["limits"]
    assert {k: reported[k] for k in LIMITS} == LIMITS, reported
    return reported


def _send(client: httpx.Client, method: str, path: str, headers: dict, body: bytes,
          chunked: bool = False) -> httpx.Response:
    """One request; ``chunked`` streams ``body`` in 1 KiB pieces with no Content-Length."""
    if not chunked:
        return client.request(method, path, headers=headers, content=body)

    def pieces() -> Iterator[bytes]:
        for start in range(0, len(body), 1024):
            yield body[start:start + 1024]

    return client.request(method, path, headers=headers, content=pieces())


def _error(response: httpx.Response, openai: bool = False) -> dict:
    error = response.json()["error"]
    assert set(error) == ({"message", "type", "param", "code"} if openai else {"code", "message"}), error
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    return error


def _padded(payload: object, size: int) -> bytes:
    """``payload`` as JSON followed by spaces (still valid JSON) to exactly ``size`` bytes."""
    raw = json.dumps(payload, ensure_ascii=False).encode()
    assert len(raw) <= size, (len(raw), size)
    return raw + b" " * (size - len(raw))


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


def _maybe_valid_model_body(body: object) -> bool:
    """True for anything shaped like {"inputs": {"x": rows of 4 numbers}}, whatever the numbers: the
    server takes booleans, and large finite floats, as numbers, so such a body may be accepted. The
    fuzz sends only bodies for which this is False (certain 422s); NaN / Infinity / float32 overflow
    and too many rows have kinds of their own."""
    if not isinstance(body, dict) or set(body) != {"inputs"} or not isinstance(body["inputs"], dict):
        return False
    if set(body["inputs"]) != {"x"} or not isinstance(body["inputs"]["x"], list) or not body["inputs"]["x"]:
        return False
    return all(isinstance(r, list) and len(r) == 4 and all(isinstance(v, (int, float)) for v in r)
               for r in body["inputs"]["x"])


def _parses(raw: bytes) -> tuple[bool, object]:
    try:
        return True, json.loads(raw)
    except (ValueError, RecursionError):
        return False, None


# ------------------------------------------------------------------------------------- strategies

_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                       st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
# Lists hold at most 5 items: random JSON never reaches the 8-input limit (413), only 422s.
_json = st.recursive(_json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                           st.dictionaries(st.text(max_size=8), inner, max_size=5)),
                     max_leaves=20)
_text = st.text(max_size=12)
_good_texts = st.lists(st.text(alphabet="今天天气真好服务很差abc", min_size=1, max_size=5), max_size=3)
_blank_text = st.sampled_from(["", " ", "\t\n", "\u3000", " \u2003 "])
_long_text = st.text(min_size=MAX_CHARS + 1, max_size=MAX_CHARS + 40).filter(str.strip)
_non_text_item = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.lists(_text, max_size=2),
                           st.dictionaries(_text, _text, max_size=2))
_good_row = st.lists(st.floats(-1e6, 1e6), min_size=4, max_size=4)


def _model_body(rows: list) -> bytes:
    return json.dumps({"inputs": {"x": rows}}).encode()


def _with_item(draw, item: object) -> dict:
    """{"inputs": [a few good texts with ``item`` at a random place]}."""
    items = draw(_good_texts)
    items.insert(draw(st.integers(0, len(items))), item)
    return {"inputs": items}


_GOOD_CHAT = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "你好"}], "max_tokens": 2}
# field -> values the schema refuses (wrong type or out of OpenAI's range)
_BAD_CHAT_VALUES = {
    "temperature": [-0.1, 2.01, "hot", None, [1]], "top_p": [0, -1, 1.5, "x"], "n": [0, -3, 1.5, "2"],
    "max_tokens": [0, -5, 2.5, "8"], "stream": ["yes", 1, None], "seed": [1.5, "7"], "stop": [3, [1, 2], {"a": 1}],
    "messages": [[], "hi", [{"role": "robot", "content": "x"}], [{"content": "x"}], [{"role": "user", "content": 5}]],
    "model": [None, 3, ["m"]], "stream_options": [{"include_usage": "yes"}, {"other": True}, 5],
}


def _valid_chat_body(body: object) -> bool:
    return isinstance(body, dict) and {"model", "messages"} <= set(body)


def _chat(body: bytes, path: str = CHAT_PATH, headers: dict | None = None) -> tuple[str, str, dict, bytes, bool]:
    return "POST", path, JSON_HEADERS if headers is None else headers, body, False


def _task(body: bytes, headers: dict | None = None) -> tuple[str, str, dict, bytes, bool]:
    return "POST", TASK_PATH, JSON_HEADERS if headers is None else headers, body, False


# kind -> (the one status, the error codes it may carry). Every kind below draws requests of its own.
EXPECTED: dict[str, tuple[int, set[str]]] = {
    "bytes": (400, {"invalid_json"}),                 # arbitrary bytes that are not JSON (or not UTF-8 at all)
    "deep": (400, {"invalid_json"}),                  # unclosed nesting thousands deep (RecursionError)
    "empty_body": (422, {"empty_body"}),
    "json": (422, {"invalid_request", "empty_input"}),  # random JSON that is not a task request
    "non_text_item": (422, {"invalid_request"}),      # a null / number / list / dict among the texts
    "blank_item": (422, {"empty_input"}),             # an empty or whitespace-only text
    "long_item": (413, {"text_too_long"}),            # one text over max_text_chars
    "not_list": (422, {"invalid_request"}),           # "inputs" is a scalar or an object
    "empty_list": (422, {"empty_input"}),             # "inputs": []
    "too_many": (413, {"too_many_inputs"}),           # over max_inputs_per_request texts
    "extra_key": (422, {"invalid_request"}),          # an unknown key next to "inputs"
    "wrong_key": (422, {"invalid_request"}),          # "input", "Inputs", ... instead of "inputs"
    "top": (422, {"invalid_request"}),                # a scalar or a list at the top level
    "surrogate": (422, {"invalid_text"}),             # "\\udXXX": valid JSON, not valid text
    "unknown_task": (404, {"unknown_task"}),
    "unknown_model": (404, {"unknown_model"}),
    "no_route": (404, {"not_found"}),
    # random JSON as model input; its numbers may also be NaN / Infinity or beyond float32, which the
    # server may find before the shape or type is wrong (3.4028235677973366e+38 in a 1-D list did)
    "model": (422, {"invalid_request", "wrong_inputs", "wrong_shape", "wrong_type", "empty_input", "non_finite",
                    "out_of_range"}),
    "model_non_finite": (422, {"non_finite"}),        # NaN / Infinity (JSON extensions) in model input
    "model_overflow": (422, {"out_of_range"}),        # finite, but too large for float32
    "model_too_many_rows": (413, {"too_many_inputs"}),
    "method": (405, {"method_not_allowed"}),
    "content_type": (415, {"unsupported_media_type"}),
    "no_content_type": (415, {"unsupported_media_type"}),
    "too_big": (413, {"body_too_large"}),             # over max_body_bytes by Content-Length
    "too_big_chunked": (413, {"body_too_large"}),     # over max_body_bytes, streamed without Content-Length
    # the OpenAI endpoints of the chat model (OpenAI's error shape; a schema error is a 400 there)
    "chat_bytes": (400, {"invalid_json"}),
    "chat_json": (400, {"invalid_request"}),          # random JSON that is not a chat / completion request
    "chat_bad_value": (400, {"invalid_request"}),     # one field of a good request of the wrong type or range
    "chat_extra_key": (400, {"invalid_request"}),     # a field OpenAI's API does not have (or sampan refuses)
    "chat_unknown_model": (404, {"model_not_found"}),
    "chat_too_long": (400, {"context_length_exceeded"}),  # prompt (or prompt + max_tokens) over the context
    "chat_content_type": (415, {"unsupported_media_type"}),
    "chat_method": (405, {"method_not_allowed"}),
    "chat_too_big": (413, {"body_too_large"}),
    # image uploads to /v1/tasks/ocr, raw or as base64 JSON
    "ocr_bytes": (422, {"invalid_image"}),            # random bytes that are no image format
    "ocr_truncated": (422, {"invalid_image"}),        # a real PNG cut short
    "ocr_huge_header": (413, {"image_too_large"}),    # a header claiming more than max_image_pixels
    "ocr_zero_size": (422, {"invalid_image", "empty_body"}),  # 0 x N header, or no bytes at all
    "ocr_content_type": (415, {"unsupported_media_type"}),    # a good PNG under a type that is no image
    "ocr_too_many": (413, {"too_many_inputs"}),       # over max_images_per_request
    "ocr_too_big": (413, {"body_too_large"}),         # over max_image_bytes
}


@st.composite
def requests(draw) -> tuple[str, tuple[str, str, dict, bytes, bool]]:
    """(kind, (method, path, headers, body, chunked)): a request the service must refuse with
    ``EXPECTED[kind]``."""
    kind = draw(st.sampled_from(sorted(EXPECTED)))
    ascii_json = draw(st.booleans())
    if kind == "bytes":
        raw = draw(st.binary(min_size=1, max_size=200))
        assume(not _parses(raw)[0])
        return kind, _task(raw)
    if kind == "deep":  # a JSONDecodeError at the end, or a RecursionError before it: 400 either way
        opener = draw(st.sampled_from(["[", '{"inputs": [', '{"a": ']))
        return kind, _task(opener.encode() * draw(st.integers(1_200, MAX_BODY // len(opener))))
    if kind == "empty_body":
        return kind, _task(b"")
    if kind == "json":
        body = draw(_json)
        assume(not _valid_task_body(body))
        return kind, _task(json.dumps(body).encode())
    if kind in ("non_text_item", "blank_item", "long_item"):
        item = draw({"non_text_item": _non_text_item, "blank_item": _blank_text, "long_item": _long_text}[kind])
        return kind, _task(json.dumps(_with_item(draw, item), ensure_ascii=ascii_json).encode())
    if kind == "not_list":
        body = {"inputs": draw(st.one_of(_json_leaf, st.dictionaries(_text, _text, max_size=3)))}
        return kind, _task(json.dumps(body, ensure_ascii=ascii_json).encode())
    if kind == "empty_list":
        return kind, _task(b'{"inputs": []}')
    if kind == "too_many":
        texts = ["好"] * draw(st.integers(MAX_INPUTS + 1, MAX_INPUTS + 30))
        return kind, _task(json.dumps({"inputs": texts}, ensure_ascii=ascii_json).encode())
    if kind == "extra_key":
        key = draw(st.text(min_size=1, max_size=8).filter(lambda k: k != "inputs"))
        body = {"inputs": draw(_good_texts) or ["好"], key: draw(_json_leaf)}
        return kind, _task(json.dumps(body, ensure_ascii=ascii_json).encode())
    if kind == "wrong_key":
        body = {draw(st.sampled_from(["input", "Inputs", "texts", "data", "", "inputs "])): ["好"]}
        return kind, _task(json.dumps(body).encode())
    if kind == "top":
        return kind, _task(json.dumps(draw(st.one_of(_json_leaf, st.lists(_text, max_size=3)))).encode())
    if kind == "surrogate":
        return kind, _task(f'{{"inputs": ["好\\u{draw(st.integers(0xD800, 0xDFFF)):04x}"]}}'.encode())
    if kind == "unknown_task":
        name = draw(st.text(alphabet=string.ascii_letters + string.digits + "_-.~中文", min_size=1, max_size=20))
        assume(name not in (TASK, "ocr", ".", ".."))
        return kind, ("POST", f"/v1/tasks/{quote(name, safe='')}", JSON_HEADERS, '{"inputs": ["好"]}'.encode(), False)
    if kind == "unknown_model":
        name = draw(st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=12))
        assume(name != "lin")
        return kind, ("POST", f"/v1/models/{name}/predict", JSON_HEADERS, _model_body([[0, 0, 0, 0]]), False)
    if kind == "no_route":
        name = draw(st.text(alphabet=string.ascii_letters + string.digits + "_-/", max_size=20))
        return kind, ("POST", f"/v2/{quote(name)}", JSON_HEADERS, '{"inputs": ["好"]}'.encode(), False)
    if kind == "model":
        body = draw(st.one_of(_json, st.fixed_dictionaries({"inputs": st.dictionaries(
            st.sampled_from(["x", "y", "input_ids"]), st.one_of(_json, st.lists(st.lists(
                st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70), _text),
                max_size=6), max_size=3)), max_size=2)})))
        assume(not _maybe_valid_model_body(body))
        return kind, ("POST", MODEL_PATH, JSON_HEADERS, json.dumps(body).encode(), False)
    if kind in ("model_non_finite", "model_overflow"):
        rows = draw(st.lists(_good_row, min_size=1, max_size=MAX_INPUTS))
        if kind == "model_non_finite":
            bad = draw(st.sampled_from([float("nan"), float("inf"), float("-inf")]))
        else:
            bad = draw(st.floats(3.5e38, 1e308)) * draw(st.sampled_from([1, -1]))
        rows[draw(st.integers(0, len(rows) - 1))][draw(st.integers(0, 3))] = bad
        return kind, ("POST", MODEL_PATH, JSON_HEADERS, _model_body(rows), False)
    if kind == "model_too_many_rows":
        rows = draw(st.lists(_good_row, min_size=MAX_INPUTS + 1, max_size=MAX_INPUTS + 20))
        return kind, ("POST", MODEL_PATH, JSON_HEADERS, _model_body(rows), False)
    if kind.startswith("chat_"):
        return kind, _chat_request(draw, kind, ascii_json)
    if kind.startswith("ocr_"):
        return kind, _ocr_request(draw, kind)
    if kind == "method":
        method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH"]))
        return kind, (method, draw(st.sampled_from([TASK_PATH, MODEL_PATH])), JSON_HEADERS,
                      '{"inputs": ["好"]}'.encode(), False)
    if kind == "content_type":
        ctype = draw(st.sampled_from(["text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                      "application/xml", "image/png", "text/json", "application/jsonl", "json"]))
        return kind, _task('{"inputs": ["今天天气真好"]}'.encode(), {"content-type": ctype})
    if kind == "no_content_type":
        return kind, _task('{"inputs": ["今天天气真好"]}'.encode(), {})
    # too_big / too_big_chunked: a valid request padded past max_body_bytes; only its size is wrong
    body = _padded({"inputs": ["今天天气真好"]}, draw(st.integers(MAX_BODY + 1, MAX_BODY * 4)))
    return kind, ("POST", TASK_PATH, JSON_HEADERS, body, kind == "too_big_chunked")


def _chat_request(draw, kind: str, ascii_json: bool) -> tuple[str, str, dict, bytes, bool]:
    path = draw(st.sampled_from([CHAT_PATH, COMPLETION_PATH]))
    good = dict(_GOOD_CHAT) if path == CHAT_PATH else {"model": CHAT_MODEL, "prompt": "你好", "max_tokens": 2}
    if kind == "chat_bytes":
        raw = draw(st.binary(min_size=1, max_size=200))
        assume(not _parses(raw)[0])
        return _chat(raw, path)
    if kind == "chat_json":
        body = draw(_json)
        assume(not _valid_chat_body(body) and not (isinstance(body, dict) and "prompt" in body))
        return _chat(json.dumps(body, ensure_ascii=ascii_json).encode(), path)
    if kind == "chat_bad_value":
        field = draw(st.sampled_from(sorted(_BAD_CHAT_VALUES)))
        if path == COMPLETION_PATH and field == "messages":
            field, good["prompt"] = "prompt", draw(st.sampled_from([None, 5, [1.5], {"a": 1}, ["x"]]))
        else:
            good[field] = draw(st.sampled_from(_BAD_CHAT_VALUES[field]))
        return _chat(json.dumps(good, ensure_ascii=ascii_json).encode(), path)
    if kind == "chat_extra_key":
        key = draw(st.one_of(st.sampled_from(["logprobs", "tools", "presence_penalty", "logit_bias", "best_of",
                                              "frequency_penalty", "response_format", "Model"]),
                             st.text(min_size=1, max_size=8)))
        assume(key not in type_fields(path))
        good[key] = draw(_json_leaf)
        return _chat(json.dumps(good, ensure_ascii=ascii_json).encode(), path)
    if kind == "chat_unknown_model":
        good["model"] = draw(st.text(max_size=20).filter(lambda name: name != CHAT_MODEL))
        return _chat(json.dumps(good, ensure_ascii=ascii_json).encode(), path)
    if kind == "chat_too_long":
        if draw(st.booleans()):
            good["max_tokens"] = draw(st.integers(CHAT_CONTEXT, 10**9))  # the prompt is a few tokens
        else:
            # each repeat is 42 bytes as ASCII JSON (\uXXXX per character): stay under max_body_bytes
            text = "今天天气真好，" * draw(st.integers(CHAT_CONTEXT // 2, (MAX_BODY - 256) // 42))
            good.update({"messages": [{"role": "user", "content": text}]} if path == CHAT_PATH else {"prompt": text})
        return _chat(json.dumps(good, ensure_ascii=ascii_json).encode(), path)
    if kind == "chat_content_type":
        ctype = draw(st.sampled_from(["text/plain", "application/xml", "multipart/form-data", "text/json"]))
        return _chat(json.dumps(good).encode(), path, {"content-type": ctype})
    if kind == "chat_method":
        return draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH"])), path, JSON_HEADERS, json.dumps(good).encode(), False
    # chat_too_big: a good request padded past max_body_bytes
    return "POST", path, JSON_HEADERS, _padded(good, draw(st.integers(MAX_BODY + 1, MAX_BODY * 4))), draw(st.booleans())


# Signatures of the formats the server opens (sampan.vision.image_input.FORMATS): random bytes that
# start with one might be a valid (if odd) image, so the fuzz leaves them out.
_SIGNATURES = (b"\x89PNG", b"\xff\xd8", b"BM", b"GIF8", b"II*", b"MM\x00*", b"RIFF", b"P")


def _noise_png(side: int, seed: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buffer, "PNG")
    return buffer.getvalue()


def _upload(draw, files: list[bytes]) -> tuple[str, str, dict, bytes, bool]:
    """The files as base64 JSON, or (one file) as the raw body under an image type."""
    import base64

    path = draw(st.sampled_from(IMAGE_PATHS))
    if len(files) == 1 and draw(st.booleans()):
        return "POST", path, {"content-type": draw(st.sampled_from(["image/png", "image/jpeg",
                                                                     "application/octet-stream"]))}, files[0], False
    body = json.dumps({"inputs": [base64.b64encode(f).decode() for f in files]}).encode()
    return "POST", path, JSON_HEADERS, body, False


def _ocr_request(draw, kind: str) -> tuple[str, str, dict, bytes, bool]:
    if kind == "ocr_bytes":
        raw = draw(st.binary(min_size=1, max_size=300))
        assume(not raw.startswith(_SIGNATURES))
        return _upload(draw, [raw])
    if kind == "ocr_truncated":
        png = _noise_png(16, draw(st.integers(0, 3)))
        return _upload(draw, [png[: draw(st.integers(1, len(png) - 40))]])  # the pixel data is cut
    if kind == "ocr_huge_header":
        width = draw(st.integers(1, 200_000))
        height = draw(st.integers(MAX_PIXELS // width + 1, 200_000))
        return _upload(draw, [png_header(width, height)])
    if kind == "ocr_zero_size":
        if draw(st.booleans()):
            return _upload(draw, [b""])
        return _upload(draw, [png_header(*draw(st.sampled_from([(0, 5), (7, 0), (0, 0)])))])
    if kind == "ocr_content_type":
        ctype = draw(st.sampled_from(["text/plain", "multipart/form-data", "application/xml", "text/json", ""]))
        return "POST", draw(st.sampled_from(IMAGE_PATHS)), {"content-type": ctype} if ctype else {}, _noise_png(8, 0), False
    if kind == "ocr_too_many":
        return _upload(draw, [_noise_png(4, 0)] * draw(st.integers(MAX_IMAGES + 1, MAX_IMAGES + 4)))
    # ocr_too_big: a good image padded past max_image_bytes (a PNG ignores what follows IEND)
    png = _noise_png(8, 0)
    return "POST", draw(st.sampled_from(IMAGE_PATHS)), {"content-type": "image/png"}, \
        png + b"\0" * (MAX_IMAGE_BYTES + 1 - len(png) + draw(st.integers(0, 4096))), False


def type_fields(path: str) -> set[str]:
    """The fields the endpoint's schema takes (an extra key must be none of them)."""
    from sampan.serving.openai_schemas import ChatCompletionRequest, CompletionRequest

    return set((ChatCompletionRequest if path == CHAT_PATH else CompletionRequest).model_fields)


def test_malformed_requests_each_get_their_one_status_and_the_server_survives(server, client):
    sent: dict[str, int] = {}

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                     HealthCheck.data_too_large])
    @given(case=requests())
    def fuzz(case):
        kind, (method, path, headers, body, chunked) = case
        response = _send(client, method, path, headers, body, chunked)
        sent[kind] = sent.get(kind, 0) + 1
        status, codes = EXPECTED[kind]
        assert response.status_code == status, (kind, method, path, headers, body[:200], response.text[:300])
        openai = path in (CHAT_PATH, COMPLETION_PATH)
        assert _error(response, openai)["code"] in codes, (kind, body[:200], response.text[:300])

    fuzz()

    assert sum(sent.values()) >= 1_000, f"only {sum(sent.values())} requests were sent"
    assert set(sent) == set(EXPECTED), f"kinds never sent: {sorted(set(EXPECTED) - set(sent))}"
    assert server.alive(), server.log_text()[-3000:]
    assert client.get("/healthz").json()["status"] == "ok"
    good = client.post(TASK_PATH, json={"inputs": ["今天天气真好"]})
    assert good.status_code == 200 and good.json()["outputs"][0]["label"] in ("positive", "negative")
    for path in IMAGE_PATHS:  # each image task still answers a good upload (OCR and layout: a list; document: Markdown)
        image = client.post(path, headers={"content-type": "image/png"}, content=_noise_png(8, 0))
        assert image.status_code == 200, (path, image.text)
        out = image.json()["outputs"][0]
        assert isinstance(out["markdown"], str) if path.endswith("/document") else isinstance(out, list), (path, out)
    reply = client.post(CHAT_PATH, json={**_GOOD_CHAT, "ignore_eos": True})  # exactly 2 tokens: 1 decode step
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    # None of the refused requests reached the model: the one decode step is the good request's second token.
    assert 'sampan_batch_size_count{target="chat"} 1.0' in client.get("/metrics").text
    # Every refusal was counted under its route template, none as a 5xx.
    metrics = client.get("/metrics").text
    assert 'status="5' not in metrics


# ------------------------------------------------------------------------- each limit at its boundary

# id -> (status, error code or None for a 200). Each "-at-limit" case sits exactly on a limit, and the
# "-one-over" case next to it one unit past it.
BOUNDARY: dict[str, tuple[int, str | None]] = {
    "inputs-at-limit": (200, None),
    "inputs-one-over": (413, "too_many_inputs"),
    "chars-at-limit": (200, None),
    "chars-at-limit-astral": (200, None),  # characters are code points: 😀 is one (two UTF-16 units)
    "chars-one-over": (413, "text_too_long"),
    "chars-one-over-after-one-at": (413, "text_too_long"),
    "inputs-and-chars-at-limit": (200, None),
    "body-at-limit": (200, None),
    "body-one-over": (413, "body_too_large"),
    "body-at-limit-chunked": (200, None),
    "body-one-over-chunked": (413, "body_too_large"),
    "model-rows-at-limit": (200, None),
    "model-rows-one-over": (413, "too_many_inputs"),
}


def _boundary_request(case: str, limits: dict) -> tuple[str, bytes, bool, int]:
    """(path, body, chunked, results a 200 carries) for ``case``, from the limits the server reports."""
    n_inputs, n_chars, n_bytes = (limits[k] for k in ("max_inputs_per_request", "max_text_chars",
                                                      "max_body_bytes"))
    over = int(case.endswith("-one-over") or case.endswith("-one-over-chunked"))
    chunked = case.endswith("-chunked")
    if case.startswith("inputs-and-chars"):
        texts = ["好" * n_chars] * n_inputs
    elif case.startswith("inputs-"):
        texts = ["好"] * (n_inputs + over)
    elif case == "chars-at-limit-astral":
        texts = ["😀" * n_chars]
    elif case == "chars-one-over-after-one-at":
        texts = ["好" * n_chars, "好" * (n_chars + 1)]
    elif case.startswith("chars-"):
        texts = ["好" * (n_chars + over)]
    elif case.startswith("body-"):
        body = _padded({"inputs": ["今天天气真好"]}, n_bytes + over)
        assert len(body) == n_bytes + over
        return TASK_PATH, body, chunked, 1
    else:  # model-rows-*
        rows = [[0.5, -1.0, 0.0, 2.0]] * (n_inputs + over)
        return MODEL_PATH, _model_body(rows), False, len(rows)
    return TASK_PATH, json.dumps({"inputs": texts}, ensure_ascii=False).encode(), False, len(texts)


@pytest.mark.parametrize("case", sorted(BOUNDARY))
def test_each_limit_admits_its_value_and_refuses_one_more(client, limits, case):
    path, body, chunked, results = _boundary_request(case, limits)
    status, code = BOUNDARY[case]
    response = _send(client, "POST", path, JSON_HEADERS, body, chunked)
    assert response.status_code == status, (case, len(body), response.text[:300])
    if code is not None:
        assert _error(response)["code"] == code
        assert str(limits[{"too_many_inputs": "max_inputs_per_request", "text_too_long": "max_text_chars",
                           "body_too_large": "max_body_bytes"}[code]]) in _error(response)["message"]
        return
    outputs = response.json()["outputs"]
    assert len(outputs["output_0"] if path == MODEL_PATH else outputs) == results

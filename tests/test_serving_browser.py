"""The demo page at `/` in headless Chromium (Debian's /usr/bin/chromium driven by the Python
playwright package; no browser download): type Chinese text, see the sentiment and its score, the
NER spans highlighted in the text, and a generated continuation - all from the real Taskflow tasks
behind a real `sampan serve` process. With a chat model (`--model`), the chat box: type a message,
see the reply stream in from /v1/chat/completions. With `--task ocr`, drop a rendered PNG on the page
and see its lines and their boxes over the image (~5 s more when the session already exported the
tiny OCR pair; the first export costs ~20-35 s).

`.ci/run` installs chromium before `make test`; without it this file is skipped and says why.
"""

from __future__ import annotations

import os

import httpx
import pytest

from sampan.server_process import ServerProcess
from tests.tiny_chat_model import GREETING, MEMORISED, build_chat_model_dir

CHROMIUM = "/usr/bin/chromium"
# From /work/shared/DEPS-VERIFIED.md: headless, no sandbox (root in CI), nothing that phones home.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason=f"{CHROMIUM} is absent: install it with `apt-get install -y --no-install-recommends "
                              "chromium fonts-wqy-microhei` (make test does, as root or through sudo)"),
]

TEXT = "李彦宏在北京创办了百度公司，这家公司的服务真不错。"
PROMPT_MAX_TOKENS = "text_generation.max_new_tokens=12"


@pytest.fixture(scope="module")
def server():
    args = ["--task", "sentiment_analysis", "--task", "ner", "--task", "text_generation",
            "--task-option", PROMPT_MAX_TOKENS, "--log-level", "warning"]
    with ServerProcess(args) as proc:
        yield proc


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()


def _api(server, task: str, text: str) -> dict:
    response = httpx.post(f"{server.url}/v1/tasks/{task}", json={"inputs": [text]}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["outputs"][0]


def test_page_shows_sentiment_entities_and_continuation(server, browser):
    page = browser.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(f"{server.url}/")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)

    page.fill("#text", TEXT)
    page.click("#run")
    page.wait_for_selector("body[data-state]", timeout=120_000)
    assert page.get_attribute("body", "data-state") == "done", page.text_content("#error")
    assert page.text_content("#error") == ""

    # Sentiment: the label and score the API gives for the same text.
    expected = _api(server, "sentiment_analysis", TEXT)
    label_class = page.get_attribute("#sentiment .label", "class")
    assert expected["label"] in label_class.split()
    assert page.text_content("#sentiment .score") == f"{expected['score']:.3f}"
    width = page.eval_on_selector("#sentiment .bar > span", "e => e.style.width")
    assert width == f"{round(expected['score'] * 100)}%"

    # NER: the text is shown whole, each entity wrapped in a <mark> of its type, in order.
    ner = _api(server, "ner", TEXT)
    assert page.text_content("#ner").startswith(TEXT)
    marks = page.eval_on_selector_all("#ner mark.ent", "ms => ms.map(m => [m.textContent, m.dataset.type])")
    assert marks == [[e["text"], e["type"]] for e in sorted(ner["entities"], key=lambda e: e["start"])]
    assert marks, f"the ner task found no entity in {TEXT!r}; the highlight went untested"
    for text, kind in marks:
        assert kind in ("PER", "LOC", "ORG") and text in TEXT

    # Generation: the prompt, then a non-empty continuation (what the task generated for this prompt).
    prompt = page.text_content("#generation .prompt")
    continuation = page.text_content("#generation .continuation")
    assert prompt == TEXT and continuation

    # Nothing was fetched from anywhere but the service itself (no CDN, no fonts, no analytics).
    assert requested and all(url.startswith(server.url) for url in requested), requested
    page.close()


def test_page_shows_the_error_message_for_bad_input(server, browser):
    page = browser.new_page()
    page.goto(f"{server.url}/")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    page.fill("#text", "长" * 5000)  # over max_text_chars (2,000): each task answers 413 text_too_long
    page.click("#run")
    page.wait_for_selector("body[data-state]", timeout=60_000)
    assert page.get_attribute("body", "data-state") == "error"
    error = page.text_content("#error")
    assert "text_too_long" in error and "max_text_chars" in error
    page.close()


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory):
    model = build_chat_model_dir(tmp_path_factory.mktemp("chat") / "tiny", context=512)
    with ServerProcess(["--model", str(model), "--device", "cpu", "--log-level", "warning"]) as proc:
        yield proc


def test_chat_box_streams_the_reply(chat_server, browser):
    page = browser.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(f"{chat_server.url}/")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    assert page.is_visible("#chat-card")
    page.fill("#chat-input", GREETING[0]["content"])
    page.click("#chat-send")
    page.wait_for_selector("body[data-chat]", timeout=60_000)
    assert page.get_attribute("body", "data-chat") == "done", page.text_content("#chat-error")
    assert page.eval_on_selector_all("#chat-log .msg.user", "ms => ms.map(m => m.textContent)") == ["你好"]
    reply = page.query_selector("#chat-log .msg.assistant")
    assert reply.text_content() == MEMORISED  # the page asks for greedy replies; the model memorised this one
    assert int(reply.get_attribute("data-chunks")) > 1  # it arrived piece by piece, not at once
    # A second turn sends the whole conversation; the page keeps both turns.
    page.fill("#chat-input", "再来一次")
    page.click("#chat-send")
    page.wait_for_function("document.querySelectorAll('#chat-log .msg.assistant').length == 2 && "
                           "document.body.dataset.chat", timeout=60_000)
    assert page.get_attribute("body", "data-chat") == "done", page.text_content("#chat-error")
    assert requested and all(url.startswith(chat_server.url) for url in requested), requested
    page.close()


@pytest.fixture(scope="module")
def ocr_server(tmp_path_factory):
    """OCR alone, on the tiny memorised pair of tests/ocr_tiny.py (its export shared through that home:
    a few seconds when the OCR tests ran first in the session, ~20-35 s of export otherwise)."""
    from tests.ocr_tiny import build_tiny_ocr

    ocr = build_tiny_ocr(tmp_path_factory.getbasetemp() / "ocr_tiny")
    args = ["--task", "ocr", "--task-option", f"ocr.det_model={ocr.det}", "--task-option", f"ocr.rec_model={ocr.rec}",
            "--device", "cpu", "--log-level", "warning"]
    with ServerProcess(args, env={"SAMPAN_HOME": str(ocr.home)}) as proc:
        yield proc, ocr


def test_dropped_image_shows_its_lines_and_boxes(ocr_server, browser):
    import base64
    import io

    from PIL import Image

    from tests.ocr_tiny import READING_ORDER

    server, ocr = ocr_server
    buffer = io.BytesIO()
    Image.fromarray(ocr.page).save(buffer, "PNG")
    page = browser.new_page()
    page.goto(f"{server.url}/")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    assert page.is_visible("#ocr-card")
    # a real drop event carrying the PNG as a File, as the browser makes when a file is dragged in
    transfer = page.evaluate_handle("""b64 => {
        const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
        const dt = new DataTransfer();
        dt.items.add(new File([bytes], "page.png", {type: "image/png"}));
        return dt;
    }""", base64.b64encode(buffer.getvalue()).decode())
    page.dispatch_event("#ocr-drop", "drop", {"dataTransfer": transfer})
    page.wait_for_selector("body[data-ocr]", timeout=60_000)
    assert page.get_attribute("body", "data-ocr") == "done", page.text_content("#ocr-error")
    assert page.eval_on_selector_all("#ocr-lines li .text", "ls => ls.map(l => l.textContent)") == READING_ORDER
    # one box per line, drawn over the image in its pixel coordinates
    api = httpx.post(f"{server.url}/v1/tasks/ocr", headers={"content-type": "image/png"}, content=buffer.getvalue(),
                     timeout=60).json()["outputs"][0]
    points = page.eval_on_selector_all("#ocr-view polygon", "ps => ps.map(p => p.getAttribute('points'))")
    drawn = [[[float(v) for v in pair.split(",")] for pair in p.split()] for p in points]
    assert drawn == [line["box"] for line in api] and len(drawn) == len(READING_ORDER)
    assert page.get_attribute("#ocr-view svg", "viewBox") == f"0 0 {ocr.page.shape[1]} {ocr.page.shape[0]}"
    page.close()

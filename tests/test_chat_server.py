"""`sampan serve --model DIR`: the OpenAI-compatible chat API with continuous batching, driven by
the official `openai` client against a real server process.

The model is a tiny Hugging Face Llama with a byte-level BPE tokenizer (most Chinese characters are
two or three tokens) and a ChatML template, trained for a moment to memorise one reply to "你好"
(tests/tiny_chat_model.py), so greedy decoding streams real multi-byte text. One server per module
(about 5 s to build and start); the whole file runs in about 30 s on 2 cores.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from sampan.server_process import ServerProcess
from sampan.serving.text_stream import IncrementalDecoder, StopMatcher
from sampan.text import PretrainedTokenizer
from tests.tiny_chat_model import GREETING, MEMORISED, build_chat_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

NAME = "tiny-chat"
CONTEXT = 8192  # long enough that a held request outlasts the test that holds it
RUNNING, WAITING = 4, 4  # small, so that the 429 is easy to reach (4 client threads never exceed it)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_chat_model_dir(tmp_path_factory.mktemp("chat") / "tiny", context=CONTEXT)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return PretrainedTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def server(model_dir):
    args = ["--model", str(model_dir), "--served-model-name", NAME, "--chat-max-running", str(RUNNING),
            "--chat-max-waiting", str(WAITING), "--device", "cpu", "--num-threads", "1", "--log-level", "warning"]
    with ServerProcess(args, startup_timeout_s=120) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    # max_retries=0: the client would otherwise retry a 429 and hide it
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def _gauge(server, state: str) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return float(re.search(rf'sampan_chat_sequences{{state="{state}"}} (\S+)', text).group(1))


def _wait_gauge(server, state: str, value: float, timeout_s: float = 3.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _gauge(server, state) == value:
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"{state} sequences stayed at {_gauge(server, state)}, expected {value}")


# ----------------------------------------------------------------------------------- streaming text


def test_the_tokenizer_splits_chinese_characters_over_byte_tokens(tokenizer):
    """The premise of the whole-character tests: most characters of the reply are several tokens."""
    split = [ch for ch in MEMORISED if len(tokenizer.encode(ch, add_special_tokens=False)) > 1]
    assert len(split) >= len(MEMORISED) // 2, split


def test_incremental_decoder_releases_only_whole_characters(tokenizer):
    text = "李白乘舟将欲行，忽闻岸上踏歌声。桃花潭水深千尺 😀 ok"
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.push(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    pieces.append(decoder.flush())
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert sum(1 for p in pieces if p) < len(tokenizer.encode(text, add_special_tokens=False))  # some were held


def test_stop_matcher_holds_a_partial_stop_and_cuts_at_the_first():
    stop = StopMatcher(["明月光", "霜"])
    assert stop.push("床前明") == ("床前", False)  # "明" may begin "明月光": held
    assert stop.push("月") == ("", False)
    assert stop.push("光，疑是") == ("", True)
    assert stop.flush() == ""
    other = StopMatcher(["明月光"])
    assert other.push("明月") == ("", False)
    assert other.push("夜") == ("明月夜", False)  # not a stop after all: released whole
    assert other.flush() == ""


# --------------------------------------------------------------------------------- the chat endpoint


def test_chat_completion_replies_with_the_memorised_text_and_counts_usage(client, tokenizer):
    reply = client.chat.completions.create(model=NAME, messages=GREETING, temperature=0, max_tokens=200)
    assert reply.object == "chat.completion" and reply.model == NAME
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == MEMORISED
    assert choice.finish_reason == "stop"
    prompt = tokenizer.apply_chat_template(GREETING, add_generation_prompt=True)
    completion = len(tokenizer.encode(MEMORISED, add_special_tokens=False)) + 1  # the reply and <|im_end|>
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(prompt), completion)
    assert reply.usage.total_tokens == len(prompt) + completion


def test_streaming_sends_whole_characters_then_usage(client, tokenizer):
    stream = client.chat.completions.create(model=NAME, messages=GREETING, temperature=0, max_tokens=200,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == MEMORISED
    assert all("\ufffd" not in p for p in pieces), pieces
    tokens = len(tokenizer.encode(MEMORISED, add_special_tokens=False))
    assert len(pieces) < tokens  # the half characters were held back, not sent
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == tokens + 1
    assert all(c.usage is None for c in chunks[:-1])


def test_max_tokens_cuts_the_reply_without_a_half_character(client):
    reply = client.chat.completions.create(model=NAME, messages=GREETING, temperature=0, max_tokens=7)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 7
    assert MEMORISED.startswith(reply.choices[0].message.content.rstrip("\ufffd"))


def test_stop_string_ends_the_reply_before_it_streaming_or_not(client):
    reply = client.chat.completions.create(model=NAME, messages=GREETING, temperature=0, stop=["明月", "zz"])
    assert reply.choices[0].message.content == "床前" and reply.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(model=NAME, messages=GREETING, temperature=0, stop="明月", stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == "床前" and not any("明" in p for p in pieces)


def test_completions_endpoint_takes_text_or_token_ids(client, tokenizer):
    prompt = tokenizer.apply_chat_template(GREETING, add_generation_prompt=True)
    by_ids = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=200)
    assert by_ids.choices[0].text == MEMORISED and by_ids.usage.prompt_tokens == len(prompt)
    text = tokenizer.apply_chat_template(GREETING, add_generation_prompt=True, tokenize=False)
    by_text = client.completions.create(model=NAME, prompt=text, temperature=0, max_tokens=200)
    assert by_text.choices[0].text == MEMORISED
    streamed = client.completions.create(model=NAME, prompt=text, temperature=0, max_tokens=200, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == MEMORISED


def test_seeded_sampling_repeats_and_n_choices_differ(client):
    ask = dict(model=NAME, messages=[{"role": "user", "content": "写一句诗"}], temperature=1.5, seed=7,
               max_tokens=24, n=2)
    first, again = client.chat.completions.create(**ask), client.chat.completions.create(**ask)
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in again.choices]
    assert texts[0] != texts[1]
    assert first.usage.completion_tokens == again.usage.completion_tokens <= 2 * 24


def test_models_endpoint_lists_the_served_model(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [NAME]
    assert client.models.retrieve(NAME).id == NAME
    assert httpx.get(f"{server.url}/healthz").json()["chat_model"] == NAME


# ------------------------------------------------------------------------------------ concurrency


REQUESTS = [  # mixed prompt and output lengths, greedy and seeded sampling
    dict(messages=[{"role": "user", "content": "你好" * k}], max_tokens=8 + 9 * k, ignore_eos=True,
         temperature=0 if k % 2 else 0.9, seed=k)
    for k in range(1, 9)
]


def _stream_text(client, request: dict) -> tuple[str, int]:
    extra = {"ignore_eos": request["ignore_eos"]}
    ask = {k: v for k, v in request.items() if k != "ignore_eos"}
    stream = client.chat.completions.create(model=NAME, stream=True, stream_options={"include_usage": True},
                                            extra_body=extra, **ask)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].usage.completion_tokens


def test_concurrent_streams_equal_the_same_requests_sent_alone(client, server):
    alone = [_stream_text(client, r) for r in REQUESTS]
    assert [n for _, n in alone] == [r["max_tokens"] for r in REQUESTS]
    before = httpx.get(f"{server.url}/metrics").text
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda r: _stream_text(client, r), REQUESTS))
    assert together == alone
    # ... and they did share decode steps: some step ran more than one sequence.
    after = httpx.get(f"{server.url}/metrics").text

    def batched_steps(text: str) -> float:
        count = float(re.search(r'sampan_batch_size_count{target="chat"} (\S+)', text).group(1))
        single = float(re.search(r'sampan_batch_size_bucket{le="1.0",target="chat"} (\S+)', text).group(1))
        return count - single

    assert batched_steps(after) > batched_steps(before)


# --------------------------------------------------------------------------------------- errors


def _openai_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    assert error["message"]
    return error


def test_errors_come_in_openai_shape(server, client):
    url = f"{server.url}/v1/chat/completions"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=GREETING)
    error = _openai_error(httpx.post(url, json={"model": "gpt-4o", "messages": GREETING}), 404, "model_not_found")
    assert error["param"] == "model" and NAME in error["message"]
    long_prompt = "天气很好，" * 2500  # over 8,192 tokens
    error = _openai_error(httpx.post(url, json={"model": NAME, "messages": [{"role": "user", "content": long_prompt}]}),
                          400, "context_length_exceeded")
    assert str(CONTEXT) in error["message"] and error["type"] == "invalid_request_error"
    error = _openai_error(httpx.post(url, json={"model": NAME, "messages": GREETING, "max_tokens": CONTEXT}),
                          400, "context_length_exceeded")
    assert error["param"] == "max_tokens" and str(CONTEXT) in error["message"]
    error = _openai_error(httpx.post(url, json={"model": NAME, "messages": GREETING, "temperature": 3}),
                          400, "invalid_request")
    assert error["param"] == "temperature"
    error = _openai_error(httpx.post(url, json={"model": NAME, "messages": GREETING, "logit_bias": {}}),
                          400, "invalid_request")
    assert "logit_bias" in error["message"]
    _openai_error(httpx.post(url, content=b"{not json", headers={"content-type": "application/json"}),
                  400, "invalid_json")
    completions = f"{server.url}/v1/completions"
    error = _openai_error(httpx.post(completions, json={"model": NAME, "prompt": [5, 10**6]}), 400, "invalid_prompt")
    assert error["param"] == "prompt" and "vocabulary" in error["message"]
    _openai_error(httpx.post(completions, json={"model": NAME, "prompt": ""}), 400, "invalid_prompt")
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": long_prompt}])


def _hold(server, results: list, index: int, opened: threading.Event, release: threading.Event,
          start: threading.Barrier) -> None:
    """A long streaming request that reads its first chunk, then waits for ``release`` and disconnects."""
    start.wait()
    body = {"model": NAME, "messages": GREETING, "max_tokens": CONTEXT - 100, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
        results[index] = r.status_code
        lines = r.iter_lines()  # kept: a dropped iterator closes the connection, which is a disconnect
        if r.status_code == 200:
            next(lines)
        opened.set()
        release.wait(30)
    # leaving the block closes the connection mid-stream: the client is gone


def test_a_full_queue_answers_429_and_disconnects_free_their_slots(server):
    n = RUNNING + WAITING + 3
    results: list = [None] * n
    opened = [threading.Event() for _ in range(n)]
    releases = [threading.Event() for _ in range(n)]
    start = threading.Barrier(n)  # all at once: the batch takes RUNNING, the queue WAITING, the rest 429
    threads = [threading.Thread(target=_hold, args=(server, results, i, opened[i], releases[i], start))
               for i in range(n)]
    for t in threads:
        t.start()
    try:
        for e in opened:
            assert e.wait(30)
        assert results.count(429) == n - RUNNING - WAITING, (results, server.log_text()[-3000:], httpx.get(f"{server.url}/metrics").text[-3000:])
        refused = httpx.post(f"{server.url}/v1/chat/completions",
                             json={"model": NAME, "messages": GREETING, "max_tokens": 4})
        _openai_error(refused, 429, "queue_full")
        assert (_gauge(server, "running"), _gauge(server, "waiting")) == (RUNNING, WAITING)
        # Clients leave: each frees its place at once (a running one's slot goes to a waiting
        # request), long before the others end.
        holders = [i for i, s in enumerate(results) if s == 200]
        for left, i in enumerate(holders[:WAITING], start=1):
            releases[i].set()
            threads[i].join(10)
            _wait_gauge(server, "waiting", WAITING - left, timeout_s=2)
            assert _gauge(server, "running") == RUNNING
        releases[holders[WAITING]].set()
        threads[holders[WAITING]].join(10)
        _wait_gauge(server, "running", RUNNING - 1, timeout_s=2)
    finally:
        for e in releases:
            e.set()
        for t in threads:
            t.join(30)
    _wait_gauge(server, "running", 0)
    _wait_gauge(server, "waiting", 0)
    # The service is whole again.
    ok = httpx.post(f"{server.url}/v1/chat/completions",
                    json={"model": NAME, "messages": GREETING, "temperature": 0, "max_tokens": 200}, timeout=60)
    assert ok.json()["choices"][0]["message"]["content"] == MEMORISED


# ------------------------------------------------------------------ the engine against eager generate


def _engine_texts(chat, prompts: list[list[int]], max_tokens: int) -> list[str]:
    from sampan.serving.chat_engine import ChatEngine, SamplingParams

    engine = ChatEngine(chat.model, chat.tokenizer, chat.num_layers, chat.eos_ids, chat.pad_id, max_running=4)
    done = threading.Semaphore(0)
    texts: list[list[str]] = [[] for _ in prompts]

    def emitter(i: int):
        def emit(event) -> None:
            texts[i].append(event.text)
            if event.finish_reason is not None:
                done.release()
        return emit

    for i, prompt in enumerate(prompts):  # queued together: they prefill and decode as one batch
        engine.submit(prompt, [SamplingParams(max_tokens=max_tokens, temperature=0)], [emitter(i)])
    engine.start()
    try:
        for _ in prompts:
            assert done.acquire(timeout=60)
    finally:
        engine.stop()
    return ["".join(t) for t in texts]


@pytest.mark.parametrize("which", ["tiny-llama", "gpt-zh"])
def test_batched_greedy_replies_equal_eager_generate_one_by_one(which, model_dir):
    """Rows of different lengths in one batch (padded, masked) give what `generate` gives each alone;
    `gpt-zh` is a store name (sampan's layout, learned positions, no chat template)."""
    import torch

    from sampan.serving.chat_model import ChatModel

    chat = ChatModel(model_dir if which == "tiny-llama" else "gpt-zh", device="cpu")
    texts = ["床前明月光", "今天天气真好，我们去公园散步吧。", "你好", "人工智能的发展趋势是什么？请详细说明。"]
    prompts = [chat.text_prompt(t) for t in texts]
    max_tokens = 24
    expected = []
    for prompt in prompts:
        out = chat.model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, eos_token_id=chat.eos_ids)
        new = [t for t in out[0, len(prompt):].tolist() if t not in chat.eos_ids]
        expected.append(chat.tokenizer.decode(new, skip_special_tokens=True))
    assert _engine_texts(chat, prompts, max_tokens) == expected

"""Chat serving: continuous batching vs one request at a time vs transformers' static batching.

One run, same model, same requests. The model is a small random Llama (Hugging Face layout,
built here in a temp dir) with a word-level tokenizer, so every token is visible text at once and
time to first token is not blurred by held-back half characters. Requests mix prompt lengths
(16-192 tokens) and output lengths (16-96 tokens, ``ignore_eos`` so each generates exactly its
length), sent as token ids to ``/v1/completions`` with ``stream: true``.

Sides, each at 1, 8 and 32 concurrent clients (closed loop: a client sends its next request when
the previous reply ends):

- ``continuous``: ``sampan serve --model DIR`` (``--chat-max-running 32``);
- ``one_at_a_time``: the same server with ``--chat-max-running 1`` (requests queue, one decodes);
- ``hf_static``: ``transformers``' ``generate`` over left-padded batches of the same requests, in
  arrival order, ``clients`` per batch (a batch runs until its longest reply ends, then the next
  starts); time to first token = from the batch's start to its first logits-processor call (its
  prefill), without streaming overheads - generous to this side.

Requests/s and time to first token (p50) per side; ratios continuous / baseline. The sides
alternate block by block (A B C, C B A), so the drift of a shared machine hits them alike.

    python benchmarks/chat_serving.py            # full
    python benchmarks/chat_serving.py --quick    # smoke (used by tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from _common import apply_presets, machine_info, set_threads, timestamp, write_json_atomic
from sampan.server_process import ServerProcess

RESULTS = Path(__file__).resolve().parent / "results" / "chat_serving.json"
NAME = "bench"
PRESETS = {
    "full": {"clients": "1,8,32", "requests": 64, "hidden": 128, "layers": 4, "repeats": 2},
    "quick": {"clients": "1,4", "requests": 8, "hidden": 32, "layers": 2, "repeats": 1},
}


def build_model(directory: Path, hidden: int, layers: int, vocab: int = 2000, context: int = 1024) -> Path:
    """A random Llama with a word-level tokenizer (``w0`` ... ``wN``), saved in HF layout."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i + 2 for i in range(vocab - 2)}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                         model_max_length=context).save_pretrained(directory)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=context, eos_token_id=1, pad_token_id=0,
                                      bos_token_id=None, tie_word_embeddings=True)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def workload(n: int, seed: int = 0, vocab: int = 2000) -> list[tuple[list[int], int]]:
    """``n`` (prompt ids, output length) pairs with mixed lengths."""
    rng = random.Random(seed)
    return [([rng.randrange(2, vocab) for _ in range(rng.choice([16, 48, 96, 192]))], rng.choice([16, 32, 64, 96]))
            for _ in range(n)]


async def _drive(url: str, requests: list[tuple[list[int], int]], clients: int) -> dict[str, Any]:
    """Closed loop: ``clients`` workers share the request list; each streams one reply at a time."""
    ttft: list[float] = []
    tokens = 0
    queue = list(enumerate(requests))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def worker() -> None:
            nonlocal tokens
            while queue:
                _, (prompt, out_len) = queue.pop(0)
                body = {"model": NAME, "prompt": prompt, "max_tokens": out_len, "temperature": 0, "stream": True,
                        "ignore_eos": True, "stream_options": {"include_usage": True}}
                start = time.perf_counter()
                first = None
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        raise RuntimeError(f"{response.status_code}: {(await response.aread())[:300]!r}")
                    async for line in response.aiter_lines():
                        # The client shares the machine's 2 cores with the server: it parses only what
                        # it measures. A completion chunk is sent only when it carries text (or ends the
                        # choice), so the first data line is the first token's text.
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        if first is None:
                            first = time.perf_counter() - start
                        if '"usage": {' in line:
                            tokens += json.loads(line[6:])["usage"]["completion_tokens"]
                ttft.append(first if first is not None else time.perf_counter() - start)

        begin = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(clients)])
        elapsed = time.perf_counter() - begin
    return _summary(len(requests), elapsed, ttft, tokens)


def _summary(n: int, elapsed: float, ttft: list[float], tokens: int) -> dict[str, Any]:
    return {"requests": n, "seconds": elapsed, "tokens": tokens, "ttft": ttft}


def _merge(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """The blocks of one side and client count as one figure (requests and seconds summed)."""
    n, seconds = sum(b["requests"] for b in blocks), sum(b["seconds"] for b in blocks)
    ttft = [t for b in blocks for t in b["ttft"]]
    return {"requests": n, "seconds": round(seconds, 3), "requests_per_s": round(n / seconds, 3),
            "tokens_per_s": round(sum(b["tokens"] for b in blocks) / seconds, 1),
            "ttft_p50_ms": round(1000 * statistics.median(ttft), 1), "ttft_mean_ms": round(1000 * statistics.fmean(ttft), 1),
            "per_block_rps": [round(b["requests"] / b["seconds"], 3) for b in blocks]}


def hf_static(directory: Path, requests: list[tuple[list[int], int]], clients: int) -> dict[str, Any]:
    """transformers' generate over left-padded batches of ``clients`` requests, in order."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    ttft: list[float] = []
    tokens = 0

    class FirstCall(transformers.LogitsProcessor):
        def __init__(self) -> None:
            self.at: float | None = None

        def __call__(self, input_ids, scores):
            if self.at is None:
                self.at = time.perf_counter()
            return scores

    begin = time.perf_counter()
    for start in range(0, len(requests), clients):
        batch = requests[start:start + clients]
        width = max(len(p) for p, _ in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, (prompt, _) in enumerate(batch):
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        longest = max(n for _, n in batch)
        first = FirstCall()
        batch_start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                                 do_sample=False, pad_token_id=0, logits_processor=[first])
        assert out.shape[1] == width + longest
        tokens += sum(n for _, n in batch)  # the useful tokens; the rest of each row is waste
        # Closed loop: a batch's clients sent their requests when the previous batch ended.
        ttft += [first.at - batch_start] * len(batch)
    return _summary(len(requests), time.perf_counter() - begin, ttft, tokens)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default=None, help="comma-separated client counts (full 1,8,32)")
    parser.add_argument("--requests", type=int, default=None, help="requests per measurement block (full 64)")
    parser.add_argument("--repeats", type=int, default=None, help="blocks per side and client count (full 2)")
    parser.add_argument("--hidden", type=int, default=None, help="model width (full 128)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (full 4)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads, server and transformers alike (default 1: on a 2-core machine "
                             "the server's HTTP loop and the client need the other core, and 2 threads on a busy "
                             "machine made every small op wait for both - transformers' generate ran 10x slower)")
    parser.add_argument("--quick", action="store_true", help="a few seconds, for the test of the JSON schema")
    parser.add_argument("--out", default=None, help=f"results JSON (default: {RESULTS})")
    args = parser.parse_args(argv)
    apply_presets(args, PRESETS["quick" if args.quick else "full"], RESULTS)
    counts = [int(c) for c in str(args.clients).split(",")]
    set_threads(args.threads)
    requests = workload(args.requests)
    sides = ("continuous", "one_at_a_time", "hf_static")
    blocks: dict[str, dict[str, list[dict[str, Any]]]] = {side: {str(c): [] for c in counts} for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        directory = build_model(Path(tmp) / "model", args.hidden, args.layers)
        common = ["--model", str(directory), "--served-model-name", NAME, "--device", "cpu", "--num-threads",
                  str(args.threads), "--log-level", "warning", "--chat-max-waiting", "100000"]
        servers = {"continuous": ServerProcess([*common, "--chat-max-running", str(max(counts))], startup_timeout_s=300),
                   "one_at_a_time": ServerProcess([*common, "--chat-max-running", "1"], startup_timeout_s=300)}
        try:
            for server in servers.values():
                server.start()
                asyncio.run(_drive(server.url, requests[:4], min(4, max(counts))))  # warm-up
            hf_static(directory, requests[:4], 4)

            def measure(side: str, clients: int) -> dict[str, Any]:
                if side == "hf_static":
                    return hf_static(directory, requests, clients)
                return asyncio.run(_drive(servers[side].url, requests, clients))

            # The sides alternate (A B C, then C B A, ...), so the drift of a shared machine hits them alike;
            # an idle server costs nothing while another side is measured.
            for r in range(args.repeats):
                for clients in counts:
                    for side in sides if r % 2 == 0 else sides[::-1]:
                        blocks[side][str(clients)].append(measure(side, clients))
                        block = blocks[side][str(clients)][-1]
                        print(f"  {side:14s} {clients:3d} clients, block {r + 1}: {block['requests']} requests in "
                              f"{block['seconds']:.2f} s", file=sys.stderr)
        finally:
            for server in servers.values():
                server.stop()
    runs = {side: {c: _merge(b) for c, b in by_clients.items()} for side, by_clients in blocks.items()}

    ratios = {}
    for clients in map(str, counts):
        cont = runs["continuous"][clients]
        ratios[clients] = {
            f"rps_vs_{base}": round(cont["requests_per_s"] / runs[base][clients]["requests_per_s"], 2)
            for base in ("one_at_a_time", "hf_static")} | {
            f"ttft_p50_{base}_over_continuous": round(runs[base][clients]["ttft_p50_ms"] / cont["ttft_p50_ms"], 2)
            for base in ("one_at_a_time", "hf_static")}
    result = {
        "benchmark": "chat_serving",
        "quick": bool(args.quick),
        "timestamp": timestamp(),
        "model": {"family": "llama (random)", "hidden": args.hidden, "layers": args.layers, "vocab": 2000},
        "requests_per_block": args.requests,
        "repeats": args.repeats,
        "prompt_tokens": [16, 48, 96, 192],
        "output_tokens": [16, 32, 64, 96],
        "threads": args.threads,
        "runs": runs,
        "ratios": ratios,
        "goal": "continuous >= 4x one_at_a_time requests/s at 32 clients on 2 cores",
        "ratio_note": "rps_vs_X: continuous requests/s / X's (higher is better); ttft_p50_X_over_continuous: X's "
                      "median time to first token / continuous's (above 1: continuous answers sooner)",
        "machine": machine_info(),
    }
    write_json_atomic(args.out, result)
    print("\n| clients | side | requests/s | tokens/s | TTFT p50 ms |")
    print("|---:|---|---:|---:|---:|")
    for clients in map(str, counts):
        for side in runs:
            r = runs[side][clients]
            print(f"| {clients} | {side} | {r['requests_per_s']:.2f} | {r['tokens_per_s']:.0f} | {r['ttft_p50_ms']:.0f} |")
    for clients, r in ratios.items():
        print(f"{clients} clients: {r}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

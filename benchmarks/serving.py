"""Serving throughput and latency: dynamic batching vs batch size 1, side by side in one run.

Starts two real ``sampan serve`` processes on loopback serving the same Taskflow task, one with
dynamic batching (``--max-batch-size N --max-wait-ms W``) and one with ``--max-batch-size 1``,
then drives each with many concurrent clients (httpx, asyncio), one short Chinese text per
request, for a fixed time. Blocks alternate between the two servers (A B B A ...) so drift and
neighbours hit both alike; the idle server costs nothing while the other is measured. Reports
requests/s, p50 / p99 latency, the mean batch the server formed (from its /metrics), and ratios.

    python benchmarks/serving.py            # full: 32 clients, 2 x 15 s per side
    python benchmarks/serving.py --quick    # smoke: 8 clients, 1 x 2 s per side (used by a test)
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from _common import apply_presets, machine_info, timestamp, write_json_atomic
from sampan.server_process import ServerProcess

RESULTS = Path(__file__).resolve().parent / "results" / "serving.json"

# Short review-like sentences (the kind the sentiment task sees); every client cycles through them.
TEXTS = [
    "这家餐厅的菜很好吃，服务也很周到。", "质量太差了，用了两天就坏了。", "物流很快，包装完好，非常满意。",
    "客服态度恶劣，再也不会买了。", "性价比很高，推荐给大家。", "房间又小又吵，一晚上没睡好。",
    "电影情节紧凑，演员演技在线。", "等了一个小时还没上菜，太失望了。", "屏幕清晰，电池也耐用。",
    "说明书写得乱七八糟，看不懂。", "老师讲得清楚，课程很有收获。", "味道一般，价格还贵。",
    "风景优美，下次还来。", "尺码偏小，穿着不舒服。", "做工精细，朋友都说好看。", "网速慢得像蜗牛。",
]

PRESETS = {
    "full": {"clients": 32, "duration": 15.0, "repeats": 2, "warmup": 3.0},
    "quick": {"clients": 8, "duration": 2.0, "repeats": 1, "warmup": 0.5},
}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _batch_stats(metrics_text: str, target: str) -> tuple[float, float]:
    """(sum, count) of the server's sampan_batch_size histogram for ``target``."""
    found = {}
    for kind in ("sum", "count"):
        match = re.search(rf'^sampan_batch_size_{kind}{{target="{re.escape(target)}"}} ([0-9.e+]+)$', metrics_text,
                          re.MULTILINE)
        found[kind] = float(match.group(1)) if match else 0.0
    return found["sum"], found["count"]


async def _drive(url: str, task: str, clients: int, duration: float) -> dict[str, Any]:
    """``clients`` loops, each sending one request at a time until ``duration`` is up."""
    latencies: list[float] = []
    errors: dict[str, int] = {}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        stop = time.perf_counter() + duration

        async def worker(offset: int) -> None:
            i = offset
            while time.perf_counter() < stop:
                text = TEXTS[i % len(TEXTS)]
                i += 1
                start = time.perf_counter()
                try:
                    response = await client.post(f"/v1/tasks/{task}", json={"inputs": [text]})
                    ok = response.status_code == 200
                    key = str(response.status_code)
                except httpx.HTTPError as err:
                    ok, key = False, type(err).__name__
                if ok:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors[key] = errors.get(key, 0) + 1

        begin = time.perf_counter()
        await asyncio.gather(*[worker(k) for k in range(clients)])
        elapsed = time.perf_counter() - begin
    return {"latencies": latencies, "errors": errors, "elapsed": elapsed}


def _measure(url: str, task: str, clients: int, duration: float) -> dict[str, Any]:
    before = _batch_stats(httpx.get(f"{url}/metrics").text, task)
    block = asyncio.run(_drive(url, task, clients, duration))
    after = _batch_stats(httpx.get(f"{url}/metrics").text, task)
    block["batched_inputs"] = after[0] - before[0]
    block["batches"] = after[1] - before[1]
    return block


def _summary(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = [x for b in blocks for x in b["latencies"]]
    elapsed = sum(b["elapsed"] for b in blocks)
    errors: dict[str, int] = {}
    for b in blocks:
        for k, v in b["errors"].items():
            errors[k] = errors.get(k, 0) + v
    batches = sum(b["batches"] for b in blocks)
    if not latencies:
        raise RuntimeError(f"no request succeeded (errors: {errors})")
    return {
        "requests_ok": len(latencies),
        "errors": sum(errors.values()),
        "errors_by_kind": errors,
        "seconds": round(elapsed, 3),
        "throughput_rps": round(len(latencies) / elapsed, 2),
        "p50_ms": round(1000 * _percentile(latencies, 0.50), 2),
        "p99_ms": round(1000 * _percentile(latencies, 0.99), 2),
        "mean_ms": round(1000 * statistics.fmean(latencies), 2),
        "mean_batch_size": round(sum(b["batched_inputs"] for b in blocks) / batches, 2) if batches else 0.0,
        "per_block_rps": [round(len(b["latencies"]) / b["elapsed"], 2) for b in blocks],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="sentiment_analysis", help="Taskflow task to serve (default: %(default)s)")
    parser.add_argument("--clients", type=int, default=None, help="concurrent clients (full 32, quick 8)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per timed block (full 15, quick 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed blocks per side (full 2, quick 1)")
    parser.add_argument("--warmup", type=float, default=None, help="untimed seconds per side first")
    parser.add_argument("--max-batch-size", type=int, default=32, help="the batching server's --max-batch-size")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the batching server's --max-wait-ms")
    parser.add_argument("--num-threads", type=int, default=None,
                        help="the servers' --num-threads (ONNX Runtime threads; default: one per core)")
    parser.add_argument("--quick", action="store_true", help="a few seconds, for the test of the JSON schema")
    parser.add_argument("--out", default=None, help=f"results JSON (default: {RESULTS})")
    args = parser.parse_args(argv)
    apply_presets(args, PRESETS["quick" if args.quick else "full"], RESULTS)

    sides = {"dynamic_batching": ["--max-batch-size", str(args.max_batch_size), "--max-wait-ms", str(args.max_wait_ms)],
             "batch_size_1": ["--max-batch-size", "1"]}
    common = ["--task", args.task, "--log-level", "warning", "--max-queue-inputs", "100000"]
    if args.num_threads is not None:
        common += ["--num-threads", str(args.num_threads)]
    servers = {name: ServerProcess([*common, *extra]) for name, extra in sides.items()}
    blocks: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    try:
        for server in servers.values():
            server.start()
        for server in servers.values():
            if args.warmup > 0:
                _measure(server.url, args.task, args.clients, args.warmup)
        order = list(sides)
        for r in range(args.repeats):
            for name in order if r % 2 == 0 else order[::-1]:
                blocks[name].append(_measure(servers[name].url, args.task, args.clients, args.duration))
                print(f"  {name:17s} block {r + 1}: {len(blocks[name][-1]['latencies'])} requests", file=sys.stderr)
    finally:
        for server in servers.values():
            server.stop()

    runs = {name: _summary(b) for name, b in blocks.items()}
    dyn, one = runs["dynamic_batching"], runs["batch_size_1"]
    ratios = {"throughput": round(dyn["throughput_rps"] / one["throughput_rps"], 2),
              "p50": round(one["p50_ms"] / dyn["p50_ms"], 2), "p99": round(one["p99_ms"] / dyn["p99_ms"], 2)}
    result = {
        "benchmark": "serving",
        "quick": bool(args.quick),
        "timestamp": timestamp(),
        "task": args.task,
        "clients": args.clients,
        "duration_s_per_block": args.duration,
        "repeats": args.repeats,
        "num_threads": args.num_threads,
        "settings": {"dynamic_batching": {"max_batch_size": args.max_batch_size, "max_wait_ms": args.max_wait_ms},
                     "batch_size_1": {"max_batch_size": 1}},
        "runs": runs,
        "ratios": ratios,
        "ratio_note": "throughput: dynamic / batch 1 (higher is better); p50, p99: batch-1 latency / dynamic "
                      "latency (above 1 means batching answers sooner)",
        "machine": machine_info(),
    }
    write_json_atomic(args.out, result)
    print(f"\nsampan serve --task {args.task}: {args.clients} concurrent clients, one text per request")
    print("| server | requests/s | p50 ms | p99 ms | mean batch |")
    print("|---|---:|---:|---:|---:|")
    for name, run in runs.items():
        print(f"| {name} | {run['throughput_rps']:.1f} | {run['p50_ms']:.1f} | {run['p99_ms']:.1f} | "
              f"{run['mean_batch_size']:.1f} |")
    print(f"| ratio | {ratios['throughput']:.2f}x | {ratios['p50']:.2f}x | {ratios['p99']:.2f}x | |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

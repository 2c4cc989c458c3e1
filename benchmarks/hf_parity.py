"""sampan's Llama-family models against transformers' on the same weights: training step and generation.

For each case (a Qwen2.5 and a Llama 3 layout), a random model is built with ``transformers``
(``Qwen2ForCausalLM`` / ``LlamaForCausalLM``, SDPA attention), saved, and opened with
``sampan.models.from_pretrained``: the same weights on both sides. Before anything is timed both
must give the same loss on the same batch (and the same greedy tokens). Then, in interleaved
blocks:

* forward + backward of a causal-LM loss (no optimizer: both would use torch's AdamW), and the
  bytes each keeps for backward (counted at autograd's saved-tensor hooks, each storage once);
* greedy generation with the KV cache (``model.generate`` on both), tokens per second.

    python benchmarks/hf_parity.py                        # writes benchmarks/results/hf_parity.json
    python benchmarks/hf_parity.py --quick --out /tmp/q.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

# Benchmarks run as scripts (python benchmarks/NAME.py): their folder is on sys.path.
from _common import load_average, machine_info, set_threads, time_interleaved, timestamp, write_json_atomic
from sampan.models import from_pretrained

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "hf_parity.json"
# Published layer shapes (Qwen2.5-0.5B: h 896, 14 / 2 heads, qkv bias, tied head; Llama 3.2-1B's
# width h 2048, 32 / 8 heads, SwiGLU 8192, untied), cut to a few layers and a 32K vocabulary so a
# step fits this machine's two cores in seconds.
CASES = {
    "qwen2": dict(arch="Qwen2ForCausalLM", config="Qwen2Config",
                  fields=dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
                              num_hidden_layers=4, vocab_size=32000, tie_word_embeddings=True,
                              max_position_embeddings=4096, rope_theta=1000000.0)),
    "llama": dict(arch="LlamaForCausalLM", config="LlamaConfig",
                  fields=dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
                              num_hidden_layers=2, vocab_size=32000, tie_word_embeddings=False,
                              max_position_embeddings=4096, rope_theta=500000.0,
                              rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
}
DEFAULTS = dict(batch=2, seq_len=256, repeats=10, prompt_len=32, new_tokens=48, gen_repeats=6)
QUICK = dict(batch=2, seq_len=16, repeats=2, prompt_len=4, new_tokens=4, gen_repeats=1)
QUICK_FIELDS = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                    num_hidden_layers=2, vocab_size=256)
LOSS_TOL = 1e-5


def _saved_bytes(fn) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn`` runs."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn()
    loss.backward()
    return sum(seen.values())


def paired_ratio(times: dict[str, Any]) -> float:
    """Median over the interleaved repeats of sampan's block time / transformers' block time."""
    pairs = zip(times["sampan"].per_step, times["transformers"].per_step, strict=True)
    return statistics.median(ours / theirs for ours, theirs in pairs)


def run_case(name: str, spec: dict[str, Any], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import transformers

    fields = {**spec["fields"], **(QUICK_FIELDS if args.quick else {})}
    config = getattr(transformers, spec["config"])(**fields)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = getattr(transformers, spec["arch"])(config).eval()
    hf.save_pretrained(tmp / name)
    ours = from_pretrained(tmp / name).eval()
    assert ours.num_parameters() == sum(p.numel() for p in hf.parameters())

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, fields["vocab_size"], (args.batch, args.seq_len), generator=gen)
    hf.train()
    ours.train()

    def hf_step():
        loss = hf(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss

    def our_step():
        loss = ours(ids, labels=ids)
        loss.backward()
        return loss

    hf_loss, our_loss = hf_step().item(), our_step().item()
    if abs(hf_loss - our_loss) > LOSS_TOL * abs(hf_loss):
        raise RuntimeError(f"{name}: losses differ ({our_loss} vs transformers {hf_loss}); not timing unequal work")
    grads = {k: p.grad for k, p in hf.named_parameters()}
    worst_grad = max((p.grad - grads[k]).abs().max().item() for k, p in ours.named_parameters())
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    step_times = time_interleaved({"sampan": our_step, "transformers": hf_step}, steps=1, repeats=args.repeats)
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)
    saved = {"sampan": _saved_bytes(lambda: ours(ids, labels=ids)),
             "transformers": _saved_bytes(lambda: hf(input_ids=ids, labels=ids).loss)}
    hf.zero_grad(set_to_none=True)
    ours.zero_grad(set_to_none=True)

    hf.eval()
    ours.eval()
    prompt = ids[:1, : args.prompt_len]
    new = args.new_tokens

    def hf_generate():
        return hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    def our_generate():
        return ours.generate(prompt, max_new_tokens=new, eos_token_id=[])

    with torch.no_grad():
        theirs, mine = hf_generate(), our_generate()
    if not torch.equal(theirs, mine):
        raise RuntimeError(f"{name}: greedy tokens differ from transformers'; not timing unequal work")
    with torch.no_grad():
        gen_times = time_interleaved({"sampan": our_generate, "transformers": hf_generate}, steps=1,
                                     repeats=args.gen_repeats)
    tokens_per_s = {k: new / t.median for k, t in gen_times.items()}
    return {
        # Blocks alternate sides, so a pair of neighbouring blocks saw the same machine: the median
        # of per-pair ratios shrugs off a slow spell that would move one side's median.
        "train_step_paired_ratio": paired_ratio(step_times),
        "generate_paired_time_ratio": paired_ratio(gen_times),
        "config": {k: v for k, v in fields.items()}, "arch": spec["arch"], "parameters": ours.num_parameters(),
        "batch": args.batch, "seq_len": args.seq_len, "loss": {"sampan": our_loss, "transformers": hf_loss},
        "max_grad_diff": worst_grad,
        "train_step": {k: t.as_dict() for k, t in step_times.items()},
        "train_step_ratio": step_times["sampan"].median / step_times["transformers"].median,
        "saved_for_backward_bytes": saved,
        "saved_for_backward_ratio": saved["sampan"] / saved["transformers"],
        "generate": {"prompt_len": args.prompt_len, "new_tokens": new, "tokens_per_s": tokens_per_s,
                     "blocks": {k: t.as_dict() for k, t in gen_times.items()}},
        "generate_speed_ratio": tokens_per_s["sampan"] / tokens_per_s["transformers"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    for key in DEFAULTS:
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run in seconds")
    parser.add_argument("--out", default=None, help=f"results JSON (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    for key, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.out = args.out or DEFAULT_OUT
    unknown = sorted(set(args.cases.split(",")) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    import transformers

    transformers.logging.set_verbosity_error()
    set_threads(args.threads)
    load_start = load_average()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases.split(","):
            results[name] = run_case(name, CASES[name], args, Path(tmp))
    out = {"benchmark": "hf_parity", "timestamp": timestamp(), "machine": machine_info(),
           "transformers": transformers.__version__, "load_average_start": load_start,
           "load_average_end": load_average(), "quick": args.quick, "cases": results}
    write_json_atomic(args.out, out)
    print(f"{'case':8s} {'params':>8s} {'step sampan':>12s} {'step HF':>9s} {'ratio':>6s} {'paired':>6s} "
          f"{'saved ratio':>11s} {'gen tok/s sampan':>17s} {'HF':>7s} {'ratio':>6s}")
    for name, r in results.items():
        s, h = r["train_step"]["sampan"]["median_step_s"], r["train_step"]["transformers"]["median_step_s"]
        g = r["generate"]["tokens_per_s"]
        print(f"{name:8s} {r['parameters'] / 1e6:7.1f}M {s:11.3f}s {h:8.3f}s {r['train_step_ratio']:6.3f} "
              f"{r['train_step_paired_ratio']:6.3f} {r['saved_for_backward_ratio']:11.3f} {g['sampan']:17.1f} {g['transformers']:7.1f} "
              f"{r['generate_speed_ratio']:6.3f}")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()

"""Greedy generation that stops when every sequence has emitted EOS, as one static graph.

    python examples/jit_export.py [--model gpt-tiny] [--num-layers 2] [--vocab-size 64] [--max-new-tokens 8] [--out DIR]
    python examples/jit_export.py --model qwen3-tiny        # any causal LM of the zoo (GPT, Llama / Qwen)

The loop is ordinary Python (`while ... and not finished.all()`); `sampan.jit.to_static` turns it
into a `torch.while_loop`, and `sampan.jit.save` writes it as `.pt2` and as ONNX (a `Loop` node)
that onnxruntime runs. The sequence buffer is allocated at full length up front because a graph
loop keeps every variable's shape; causal attention makes the padding after the cursor harmless.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import sampan


def make_generate(model, max_new_tokens: int, eos: int, pad: int):
    """A greedy decoder over ``model`` (no KV cache, so every step has the same shapes)."""

    def generate(input_ids):
        batch, prompt_len = input_ids.shape
        total = prompt_len + max_new_tokens
        buf = torch.full((batch, total), pad, dtype=input_ids.dtype)
        buf = torch.cat([input_ids, buf[:, prompt_len:]], dim=1)
        finished = torch.zeros(batch, dtype=torch.bool)
        cur = torch.tensor(prompt_len)
        while cur < total and not finished.all():
            logits = model(buf)
            last = logits.index_select(1, (cur - 1).reshape(1)).squeeze(1)
            token = torch.where(finished, pad, last.argmax(-1))
            buf = buf.index_copy(1, cur.reshape(1), token[:, None])
            finished = finished | (token == eos)
            cur = cur + 1
        return buf, cur

    return generate


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt-tiny", help="a name from `sampan models` (default: gpt-tiny)")
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=64, help="small, so rows share a token to stop on")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--out", default=None, help="directory for the exported files (default: a temp dir)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default: inductor)")
    args = parser.parse_args(argv)

    sampan.seed(0)
    model = sampan.models.create(args.model, num_layers=args.num_layers, vocab_size=args.vocab_size,
                                  max_position_embeddings=64).eval()
    prompt = torch.randint(1, model.config.vocab_size, (1, 4), generator=torch.Generator().manual_seed(0))
    # Two rows; row 1 first repeats row 0's prompt so that both can reach the same EOS.
    prompt = torch.cat([prompt, prompt])
    # An untrained model has no real EOS: take as EOS a token that every row emits early (the
    # rows of this prompt share one), so that the early exit really happens.
    with torch.no_grad():
        free_run, _ = make_generate(model, args.max_new_tokens, eos=-1, pad=0)(prompt)
    new_tokens = free_run[:, prompt.shape[1]:]
    common = set(new_tokens[0].tolist()).intersection(*(set(row.tolist()) for row in new_tokens[1:]))
    first_hit = {t: max(row.tolist().index(t) for row in new_tokens) for t in common}
    eos = min(first_hit, key=first_hit.get) if common else int(new_tokens[0, 0])
    generate = make_generate(model, args.max_new_tokens, eos=eos, pad=0)

    with torch.no_grad():
        eager_ids, eager_steps = generate(prompt)
        static = sampan.jit.to_static(generate, backend=args.backend)
        static_ids, static_steps = static(prompt)
        out = Path(args.out or tempfile.mkdtemp(prefix="sampan-jit-"))
        sampan.jit.save(static, out / "generate")
        pt2_ids, pt2_steps = sampan.jit.load(out / "generate")(prompt)
        ort_ids, ort_steps = sampan.jit.load(out / "generate", backend="onnxruntime")(prompt)
    print(f"eos={eos}  stopped at position {int(static_steps)} of {prompt.shape[1] + args.max_new_tokens}")
    print("to_static ids:", static_ids.tolist())
    print("stats:", static.stats())
    print("exported to", out)
    return {"eager": (eager_ids, eager_steps), "static": (static_ids, static_steps), "pt2": (pt2_ids, pt2_steps),
            "onnx": (ort_ids, ort_steps), "stats": static.stats(), "prompt": prompt, "model": model, "eos": eos}


if __name__ == "__main__":
    main()

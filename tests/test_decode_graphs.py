"""KV-cache decoding from an export: prefill + one-step decode graphs, the Generator, sampling.

A tiny random Hugging Face ``LlamaForCausalLM`` (2 layers, hidden 32, vocab 128) is saved, opened
by sampan's HF loader and exported once per module (full-window + prefill + decode graphs, each
checked against eager: ~15 s); a 1-layer GPT once more (~10 s). Greedy decoding through the graphs
(ONNX Runtime and the .pt2) must equal eager ``generate`` and ``transformers``' ``generate`` token
for token. Cost: about 50 s on 2 cores (the exports), and ~25 s more for the benchmark's quick run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from sampan.inference import Config, Generator, SamplingParams, create_generator, export_pretrained
from sampan.inference.decoders import GraphDecoder
from sampan.inference.sampling import apply_repetition_penalty, filter_top_k_top_p
from sampan.models import from_pretrained
from sampan.models.generation import apply_repetition_penalty as torch_penalty
from sampan.models.generation import filter_top_k_top_p as torch_filter
from sampan.models.registry import create
from sampan.nn.kv_cache import FunctionalKVCache

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 128
NEW_TOKENS = 40
PROMPTS = [[5, 17, 33, 2, 90, 11, 7], [44, 12, 99]]  # unequal lengths: the second is left-padded


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A random HF Llama (weights perturbed so the greedy path wanders over the vocabulary), its
    sampan twin from the HF loader, and the sampan export."""
    root = tmp_path_factory.mktemp("decode")
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=96,
                                      tie_word_embeddings=False, eos_token_id=None)  # 40 tokens, no early end
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(root / "hf")
    ours = from_pretrained(root / "hf")
    export = export_pretrained(ours, root / "export", task="text_generation")
    return {"hf": hf, "ours": ours, "dir": export, "root": root}


def _padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


class CharTokenizer:
    """Token i is the i-th CJK ideograph: a decode() for stop strings that maps one token to one char."""

    def decode(self, ids):
        return "".join(chr(0x4E00 + int(i)) for i in ids)


def test_exported_greedy_decoding_equals_eager_and_transformers(llama):
    ids, mask = _padded(PROMPTS)
    width = ids.shape[1]
    want = llama["hf"].generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                pad_token_id=0)[:, width:].tolist()
    assert len(set(want[0])) >= 8 and want[0] != want[1]  # a path that moves, so equality means something
    eager = llama["ours"].generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)[:, width:].tolist()
    assert eager == want
    runs = {"onnxruntime": create_generator(Config(llama["dir"])),
            "torch": create_generator(Config(llama["dir"], backend="torch")),
            "eager": Generator.from_model(llama["ours"])}
    for name, generator in runs.items():
        out = generator.generate(PROMPTS, max_tokens=NEW_TOKENS)
        assert [o.token_ids for o in out] == want, name
        assert [o.finish_reason for o in out] == ["length", "length"] and [o.prompt_tokens for o in out] == [7, 3]


def test_decode_graphs_have_onnx_cache_names_and_dynamic_shapes(llama):
    import onnx

    top = json.loads((llama["dir"] / "inference.json").read_text())
    assert top["decode_graphs"] == {"prefill": "prefill", "decode": "decode", "num_layers": 2, "kv_heads": 2,
                                    "head_dim": 8}
    cache = [f"{kind}.{i}.{part}" for kind in ("past_key_values",) for i in range(2) for part in ("key", "value")]
    present = [name.replace("past_key_values", "present") for name in cache]
    for sub, inputs in (("prefill", ["input_ids", "attention_mask"]), ("decode", ["input_ids", "attention_mask", *cache])):
        meta = json.loads((llama["dir"] / sub / "inference.json").read_text())
        assert [e["name"] for e in meta["inputs"]] == inputs and [e["name"] for e in meta["outputs"]] == ["logits", *present]
        graph = onnx.load(str(llama["dir"] / sub / "inference.onnx")).graph
        assert [i.name for i in graph.input] == inputs and [o.name for o in graph.output] == ["logits", *present]
        # batch and every length are dynamic; the batch is one size throughout
        assert {d["symbol"] for e in meta["inputs"] for d in e["dims"][:1]} == {"input_ids.shape[0]"}
    decode = {e["name"]: e for e in json.loads((llama["dir"] / "decode" / "inference.json").read_text())["inputs"]}
    assert decode["input_ids"]["shape"] == [None, 1] and decode["attention_mask"]["shape"] == [None, None]
    assert decode["past_key_values.1.value"]["shape"] == [None, 2, None, 8]


def test_sampling_is_seeded_and_the_same_on_graph_and_eager(llama):
    graph, eager = create_generator(Config(llama["dir"])), Generator.from_model(llama["ours"])
    settings = {"max_tokens": 24, "temperature": 0.9, "top_k": 20, "top_p": 0.9, "seed": 7}
    first = [o.token_ids for o in graph.generate(PROMPTS, **settings)]
    assert [o.token_ids for o in graph.generate(PROMPTS, **settings)] == first  # repeatable
    assert [o.token_ids for o in eager.generate(PROMPTS, **settings)] == first  # same logits, same draws
    assert [o.token_ids for o in graph.generate(PROMPTS, **{**settings, "seed": 8})] != first
    greedy = [o.token_ids for o in graph.generate(PROMPTS, max_tokens=24)]
    assert [o.token_ids for o in graph.generate(PROMPTS, max_tokens=24, temperature=1.5, top_k=1, seed=3)] == greedy
    assert [o.token_ids for o in graph.generate(PROMPTS, max_tokens=24, temperature=1.5, top_p=1e-6, seed=3)] == greedy


def test_repetition_penalty_equals_eager_generate(llama):
    prompt = PROMPTS[0]
    want = llama["ours"].generate(torch.tensor([prompt]), max_new_tokens=30, repetition_penalty=1.5)[0, len(prompt):]
    (out,) = create_generator(Config(llama["dir"])).generate(prompt, max_tokens=30, repetition_penalty=1.5)
    assert out.token_ids == want.tolist()
    assert out.token_ids != create_generator(Config(llama["dir"])).generate(prompt, max_tokens=30)[0].token_ids


def test_stop_strings_eos_and_max_tokens(llama):
    tok = CharTokenizer()
    generator = create_generator(Config(llama["dir"]), tokenizer=tok)
    free = generator.generate(PROMPTS, max_tokens=20)
    assert [o.finish_reason for o in free] == ["length", "length"]
    assert free[0].text == tok.decode(free[0].token_ids)
    # A stop string of two tokens from the middle of row 0's text: the text is cut before it, the
    # tokens end with the one that completed it; row 1, whose text lacks it, goes on to max_tokens.
    stop = tok.decode(free[0].token_ids[5:7])
    start = free[0].text.find(stop)
    assert stop not in free[1].text
    stopped = generator.generate(PROMPTS, max_tokens=20, stop=[stop, "not-in-vocab"])
    assert stopped[0].text == free[0].text[:start] and stopped[0].finish_reason == "stop"
    assert stopped[0].token_ids == free[0].token_ids[: start + 2]
    assert stopped[1].token_ids == free[1].token_ids and stopped[1].finish_reason == "length"
    # An end-of-sequence id ends its row without being included; the other row, which never
    # generates it, is unaffected (and runs on alone).
    eos = free[0].token_ids[4]
    assert eos not in free[1].token_ids
    out = create_generator(Config(llama["dir"]), eos_token_id=eos).generate(PROMPTS, max_tokens=20)
    assert out[0].token_ids == free[0].token_ids[: free[0].token_ids.index(eos)] and out[0].finish_reason == "stop"
    assert out[1].token_ids == free[1].token_ids and out[1].finish_reason == "length"
    with pytest.raises(ValueError, match="give the Generator a tokenizer"):
        create_generator(Config(llama["dir"])).generate(PROMPTS, stop="x")
    with pytest.raises(ValueError, match=r"exceeds the model's 96 positions"):
        generator.generate(PROMPTS, max_tokens=90)


def test_an_export_without_decode_graphs_still_generates_and_says_to_re_export(llama, tmp_path):
    old = tmp_path / "old-export"
    shutil.copytree(llama["dir"], old, ignore=shutil.ignore_patterns("prefill", "decode"))
    with pytest.warns(UserWarning, match="no decode graphs .* export it again"):
        generator = create_generator(Config(old))
    want = [o.token_ids for o in create_generator(Config(llama["dir"])).generate(PROMPTS, max_tokens=12)]
    assert [o.token_ids for o in generator.generate(PROMPTS, max_tokens=12)] == want
    with pytest.raises(FileNotFoundError, match="no decode graphs .* export it again"):
        GraphDecoder.open(Config(old))


def test_gpt_decode_graphs_equal_eager_generate(tmp_path):
    torch.manual_seed(3)
    model = create("gpt-tiny", num_layers=1, hidden_size=32, num_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
                   initializer_range=0.3).eval()
    export = export_pretrained(model, tmp_path / "gpt")
    ids, mask = _padded(PROMPTS)
    want = model.generate(ids, attention_mask=mask, max_new_tokens=20, eos_token_id=[])[:, ids.shape[1]:].tolist()
    out = create_generator(Config(export), eos_token_id=[]).generate(PROMPTS, max_tokens=20)
    assert [o.token_ids for o in out] == want


def test_numpy_sampling_keeps_the_candidates_torch_generation_keeps():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 50)).astype(np.float64) * 3
    history = rng.integers(0, 50, (6, 12))
    for top_k, top_p in ((0, 1.0), (5, 1.0), (0, 0.6), (7, 0.8), (1, 1.0), (0, 1e-9)):
        want = torch_filter(torch.from_numpy(logits), top_k, top_p).isfinite().numpy()
        got = np.stack([np.isfinite(filter_top_k_top_p(row.copy(), top_k, top_p)) for row in logits])
        assert (got == want).all(), (top_k, top_p)
    want = torch_penalty(torch.from_numpy(logits), torch.from_numpy(history), 1.7).numpy()
    got = np.stack([apply_repetition_penalty(row.copy(), h.tolist(), 1.7) for row, h in zip(logits, history, strict=True)])
    np.testing.assert_allclose(got, want)
    for bad in ({"temperature": -1}, {"top_k": -2}, {"top_p": 0}, {"repetition_penalty": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_functional_cache_is_tensors_in_tensors_out():
    k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    cache = FunctionalKVCache(2, [(k, v), (k, v)])
    assert cache.seq_len() == 4
    keys, values = cache.update(0, k[:, :, :1], v[:, :, :1])
    assert keys.shape[2] == 5 and torch.equal(keys[:, :, :4], k) and torch.equal(values[:, :, 4:], v[:, :, :1])
    with pytest.raises(RuntimeError, match="updated twice"):
        cache.update(0, k, v)
    with pytest.raises(RuntimeError, match=r"layers \[1\] were never updated"):
        cache.flat_present()
    assert FunctionalKVCache(1).seq_len() == 0
    with pytest.raises(ValueError, match="past holds 1 layers"):
        FunctionalKVCache(2, [(k, v)])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_decode_benchmark_quick_times_equal_work(tmp_path):
    """benchmarks/decode.py --quick: every side generates the same tokens before it is timed, and
    the JSON holds tokens/s and ratios per length (~25 s: one more tiny export)."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "decode.json"
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "decode.py"), "--quick", "--out", str(out)],
                         capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["benchmark"] == "decode" and result["quick"] and result["equal_work"]
    sides = {"cached_ort", "cached_pt2", "eager_cached", "full_window_ort", "transformers"}
    assert set(result["sides"]) == sides and set(result["lengths"]) == {"8", "24"}
    for row in result["lengths"].values():
        assert row["equal_work"] and not row["mismatches"]
        assert set(row["tokens_per_s"]) == sides and all(v > 0 for v in row["tokens_per_s"].values())
        tps = row["tokens_per_s"]
        assert row["cached_ort_over"]["full_window_ort"] == pytest.approx(tps["cached_ort"] / tps["full_window_ort"])
    assert result["goal"]["measured"] is None  # the quick run has no 256-token row

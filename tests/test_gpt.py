"""GPT: forward, loss, gradients, tied embeddings, KV-cache generation, sampling, training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import sampan
from sampan.models import GPTForCausalLM, GPTModel
from sampan.nn import KVCache

VOCAB = 512


def tiny_gpt(seed: int = 0, **overrides) -> GPTForCausalLM:
    torch.manual_seed(seed)
    config = {"vocab_size": VOCAB, "num_layers": 2, "max_position_embeddings": 64, **overrides}
    return sampan.models.create("gpt-tiny", **config)


def random_ids(batch: int, seq: int, seed: int = 0, low: int = 1) -> torch.Tensor:
    return torch.randint(low, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------
# forward, loss, gradients


def test_forward_shapes_and_dtypes():
    model = tiny_gpt().eval()
    assert isinstance(model, GPTForCausalLM) and isinstance(model, torch.nn.Module)
    ids = random_ids(3, 10)
    logits = model(ids)
    assert logits.shape == (3, 10, VOCAB) and logits.dtype == torch.float32
    hidden = model.gpt(ids)
    assert isinstance(model.gpt, GPTModel)
    assert hidden.shape == (3, 10, model.config.hidden_size) and hidden.dtype == torch.float32
    torch.testing.assert_close(logits, hidden @ model.lm_head.weight.T)


def test_bf16_forward_dtype_and_fp32_loss():
    torch.manual_seed(0)
    model = sampan.models.create("gpt-tiny", vocab_size=VOCAB, num_layers=1, dtype="bfloat16").eval()
    ids = random_ids(2, 6)
    assert model(ids).dtype == torch.bfloat16
    loss = model(ids, labels=ids)
    assert loss.dtype == torch.float32 and bool(torch.isfinite(loss))


def test_position_ids_default_and_explicit_agree():
    model = tiny_gpt().eval()
    ids = random_ids(2, 8)
    explicit = model(ids, position_ids=torch.arange(8)[None].expand(2, 8))
    torch.testing.assert_close(model(ids), explicit, rtol=0, atol=0)


def test_too_long_sequence_is_value_error():
    model = tiny_gpt().eval()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(random_ids(1, 65))


def test_loss_equals_manual_shifted_cross_entropy():
    model = tiny_gpt(1).eval()
    ids = random_ids(2, 12, seed=3)
    logits = model(ids)
    manual = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    loss = model(ids, labels=ids)
    assert loss.dim() == 0
    torch.testing.assert_close(loss, manual, rtol=1e-6, atol=1e-6)
    # Untrained: close to uniform over the vocabulary.
    assert abs(loss.item() - torch.log(torch.tensor(float(VOCAB))).item()) < 0.5


def test_loss_ignores_minus_100():
    model = tiny_gpt(2).eval()
    ids = random_ids(2, 10, seed=4)
    labels = ids.clone()
    labels[0, 3:7] = -100
    labels[1, 8] = -100
    logits = model(ids)[:, :-1]
    target = labels[:, 1:]
    keep = target != -100
    manual = F.cross_entropy(logits[keep], target[keep])
    torch.testing.assert_close(model(ids, labels=labels), manual, rtol=1e-6, atol=1e-6)
    # And it differs from the unmasked loss (the ignored labels really were dropped).
    assert not torch.allclose(model(ids, labels=ids), manual)


def test_labels_shape_mismatch():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="labels shape"):
        model(random_ids(2, 5), labels=random_ids(2, 4))


def test_backward_gives_finite_grads_for_every_parameter():
    model = tiny_gpt(3)
    ids = random_ids(2, 16, seed=5)
    model(ids, labels=ids).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert bool(torch.isfinite(param.grad).all()), name
        if "position_embeddings" not in name:
            assert float(param.grad.abs().sum()) > 0, name


def test_tied_embedding():
    model = tiny_gpt()
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.gpt.embeddings.word_embeddings.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names  # counted once
    assert model.num_parameters() == model.config.num_parameters("causal_lm")
    ids = random_ids(1, 6)
    model(ids, labels=ids).backward()
    # One tensor, one gradient (from both the lookup and the head).
    assert model.lm_head.weight.grad is model.gpt.embeddings.word_embeddings.weight.grad


def test_untied_config():
    tied = tiny_gpt()
    untied = tiny_gpt(tie_word_embeddings=False)
    assert untied.lm_head.weight is not untied.gpt.embeddings.word_embeddings.weight
    assert not torch.equal(untied.lm_head.weight, untied.gpt.embeddings.word_embeddings.weight)
    h = untied.config.hidden_size
    assert untied.num_parameters() == tied.num_parameters() + VOCAB * h
    assert untied.num_parameters() == untied.config.num_parameters("causal_lm")


def test_kv_cache_forward_matches_full_forward():
    model = tiny_gpt(4).eval()
    ids = random_ids(2, 14, seed=6)
    full = model(ids)
    cache = KVCache(model.config.num_layers)
    pieces = [model(ids[:, :5], kv_cache=cache)]
    for t in range(5, 14):
        pieces.append(model(ids[:, t:t + 1], kv_cache=cache))
    assert cache.seq_len() == 14
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-5)


def test_causality():
    model = tiny_gpt(5).eval()
    ids = random_ids(1, 10, seed=7)
    changed = ids.clone()
    changed[0, 7] = (changed[0, 7] + 1) % VOCAB
    a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


# --------------------------------------------------------------------------------------------
# generation


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_cache_equals_no_cache(seed):
    model = tiny_gpt(seed, initializer_range=0.1)
    prompt = random_ids(2, 6, seed=seed + 10)
    with_cache = model.generate(prompt, max_new_tokens=24, use_cache=True)
    without = model.generate(prompt, max_new_tokens=24, use_cache=False)
    assert with_cache.shape == (2, 30)
    assert torch.equal(with_cache[:, :6], prompt)
    assert torch.equal(with_cache, without)


def manual_greedy(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy decoding by re-running the full forward each step (no cache, no mask)."""
    seqs = prompt
    with torch.no_grad():
        for _ in range(n):
            nxt = model(seqs)[:, -1].argmax(-1)
            seqs = torch.cat([seqs, nxt[:, None]], dim=1)
    return seqs


def test_greedy_matches_manual_argmax_loop():
    model = tiny_gpt(7, initializer_range=0.1).eval()
    prompt = random_ids(2, 5, seed=8)
    assert torch.equal(model.generate(prompt, max_new_tokens=20), manual_greedy(model, prompt, 20))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_batch_equals_rows_alone(seed, use_cache):
    model = tiny_gpt(seed, initializer_range=0.1)
    pad = 0
    long_row = random_ids(1, 8, seed=seed + 20)
    short_row = random_ids(1, 4, seed=seed + 30)
    batch = torch.cat([long_row, torch.cat([torch.full((1, 4), pad), short_row], dim=1)])
    mask = torch.tensor([[1] * 8, [0] * 4 + [1] * 4])
    n = 22
    out = model.generate(batch, max_new_tokens=n, attention_mask=mask, use_cache=use_cache)
    assert out.shape == (2, 8 + n)
    assert torch.equal(out[:, :8], batch)
    alone_long = model.generate(long_row, max_new_tokens=n)
    alone_short = model.generate(short_row, max_new_tokens=n)
    assert torch.equal(out[0, 8:], alone_long[0, 8:])
    assert torch.equal(out[1, 8:], alone_short[0, 4:])


def test_left_padded_logits_equal_unpadded_logits():
    model = tiny_gpt(3).eval()
    row = random_ids(1, 6, seed=40)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), row], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    torch.testing.assert_close(model(padded, attention_mask=mask)[:, 3:], model(row), rtol=0, atol=1e-5)
    # The padding-free mask path gives the same as no mask at all.
    torch.testing.assert_close(model(row, attention_mask=torch.ones(1, 6)), model(row), rtol=0, atol=1e-5)


def test_sampling_with_seeded_generator_is_repeatable():
    model = tiny_gpt(1)
    prompt = random_ids(2, 4, seed=50)
    kwargs = {"max_new_tokens": 20, "do_sample": True, "temperature": 1.5}
    a = model.generate(prompt, generator=torch.Generator().manual_seed(11), **kwargs)
    b = model.generate(prompt, generator=torch.Generator().manual_seed(11), **kwargs)
    c = model.generate(prompt, generator=torch.Generator().manual_seed(12), **kwargs)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    assert a.shape == (2, 24) and int(a.min()) >= 0 and int(a.max()) < VOCAB


def test_top_k_1_and_tiny_top_p_equal_greedy():
    model = tiny_gpt(2, initializer_range=0.1)
    prompt = random_ids(2, 5, seed=60)
    greedy = model.generate(prompt, max_new_tokens=20)
    top1 = model.generate(prompt, max_new_tokens=20, do_sample=True, top_k=1,
                          generator=torch.Generator().manual_seed(0))
    nucleus = model.generate(prompt, max_new_tokens=20, do_sample=True, top_p=1e-6,
                             generator=torch.Generator().manual_seed(0))
    assert torch.equal(top1, greedy)
    assert torch.equal(nucleus, greedy)


def expected_with_eos(free: torch.Tensor, prompt_len: int, eos: int, pad: int) -> torch.Tensor:
    """What generation with ``eos`` must give, derived from an unconstrained greedy run."""
    out = free.clone()
    ends = []
    for row in range(out.shape[0]):
        gen = out[row, prompt_len:]
        hits = (gen == eos).nonzero()
        if len(hits):
            first = int(hits[0])
            gen[first + 1:] = pad
            ends.append(first + 1)
        else:
            ends.append(None)
    if all(e is not None for e in ends):
        out = out[:, :prompt_len + max(ends)]
    return out


def test_eos_stops_and_pads():
    model = tiny_gpt(8, initializer_range=0.1)
    prompt = random_ids(2, 5, seed=70)
    n = 16
    free = model.generate(prompt, max_new_tokens=n)
    # eos: row 0's third generated token (a token it will certainly emit).
    eos = int(free[0, 5 + 2])
    pad = VOCAB - 1 if eos != VOCAB - 1 else VOCAB - 2
    out = model.generate(prompt, max_new_tokens=n, eos_token_id=eos, pad_token_id=pad)
    assert torch.equal(out, expected_with_eos(free, 5, eos, pad))
    # A single row stops right after its eos.
    single = model.generate(prompt[:1], max_new_tokens=n, eos_token_id=eos, pad_token_id=pad)
    first = int((free[0, 5:] == eos).nonzero()[0])
    assert single.shape == (1, 5 + first + 1)
    assert int(single[0, -1]) == eos


def test_eos_from_config_and_pad_defaults_to_eos():
    model = tiny_gpt(8, initializer_range=0.1)
    prompt = random_ids(2, 5, seed=70)
    free = model.generate(prompt, max_new_tokens=16)
    eos = int(free[1, 5 + 1])
    model.config = model.config.replace(eos_token_id=eos)
    out = model.generate(prompt, max_new_tokens=16)
    assert torch.equal(out, expected_with_eos(free, 5, eos, eos))


def test_generate_length_limit():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.generate(random_ids(1, 60), max_new_tokens=5)
    out = model.generate(random_ids(1, 60), max_new_tokens=4)  # exactly the limit is fine
    assert out.shape == (1, 64)


def test_generate_argument_errors():
    model = tiny_gpt()
    ids = random_ids(1, 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        model.generate(ids, max_new_tokens=-1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(ids, do_sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(ids, top_p=0.0)
    with pytest.raises(ValueError, match="seq_len"):
        model.generate(ids[0])
    assert torch.equal(model.generate(ids, max_new_tokens=0), ids)


def test_generate_restores_training_mode_and_uses_eval():
    model = tiny_gpt(3, dropout=0.3, attention_dropout=0.3)
    prompt = random_ids(2, 4, seed=80)
    model.train()
    a = model.generate(prompt, max_new_tokens=10)
    assert model.training and all(m.training for m in model.modules())
    b = model.generate(prompt, max_new_tokens=10)
    assert torch.equal(a, b)  # dropout was off inside generate
    model.eval()
    c = model.generate(prompt, max_new_tokens=10)
    assert not model.training
    assert torch.equal(a, c)


def test_repetition_penalty_matches_ctrl_rule():
    model = tiny_gpt(4, initializer_range=0.1).eval()
    prompt = random_ids(2, 4, seed=90)
    penalty = 1.8
    seqs = prompt
    with torch.no_grad():
        for _ in range(12):
            logits = model(seqs)[:, -1].clone()
            for row in range(logits.shape[0]):
                for tok in set(seqs[row].tolist()):
                    value = logits[row, tok]
                    logits[row, tok] = value / penalty if value > 0 else value * penalty
            seqs = torch.cat([seqs, logits.argmax(-1)[:, None]], dim=1)
    out = model.generate(prompt, max_new_tokens=12, repetition_penalty=penalty)
    assert torch.equal(out, seqs)
    assert not torch.equal(out, model.generate(prompt, max_new_tokens=12))
    with pytest.raises(ValueError, match="repetition_penalty"):
        model.generate(prompt, repetition_penalty=0.0)


def test_adamw_training_reduces_loss():
    model = tiny_gpt(0)
    ids = random_ids(4, 16, seed=100)
    opt = sampan.optimizer.AdamW(learning_rate=3e-3, parameters=model.parameters())
    losses = []
    for _ in range(15):
        loss = model(ids, labels=ids)
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.clear_grad()
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0] - 1.5, losses
    assert losses[-1] < min(losses[:5])

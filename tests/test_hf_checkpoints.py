"""Hugging Face checkpoints both ways, for every model_type sampan reads, against ``transformers``.

Each case builds a random tiny model with ``transformers`` (no Hub downloads), saves it, opens it
with ``sampan.models.from_pretrained`` (same logits, same greedy tokens), writes it back with
``save_pretrained(format="hf")`` and reopens that with ``transformers`` (same logits again).
sampan's own models go the other way: created in sampan, exported, opened by ``transformers``.
"""

from __future__ import annotations

import json

import pytest
import torch

import sampan
from sampan.models import from_pretrained

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-4
VOCAB = 128
# Norm epsilons far from every default (transformers' and sampan's: 1e-6 RMSNorm, 1e-5 GPT-2,
# 1e-12 BERT): at these tiny models' activation scale, a mapping that dropped the field (in either
# direction) and fell back to a default moves the logits by 3e-2 or more, 300 x TOL.
EPS = 1e-3
# sampan's own ERNIE at its init (classifier weights of std 0.02, logits ~0.02): 1e-3 moves the
# post-norm sequence classifier's logits by only 1.5e-5 when dropped; 0.1 moves them by 1.2e-3.
OWN_ENCODER_EPS = 0.1
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=64, rms_norm_eps=EPS)
ENCODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=40, layer_norm_eps=EPS)

# model_type -> (transformers class, its config): every model_type from_pretrained reads.
CASES = {
    "llama": ("LlamaForCausalLM", lambda: transformers.LlamaConfig(
        **DECODER, num_key_value_heads=2, rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16})),
    "qwen2": ("Qwen2ForCausalLM", lambda: transformers.Qwen2Config(**DECODER, num_key_value_heads=2,
                                                                   tie_word_embeddings=True)),
    "qwen3": ("Qwen3ForCausalLM", lambda: transformers.Qwen3Config(**DECODER, num_key_value_heads=2, head_dim=16,
                                                                   tie_word_embeddings=False)),
    "gpt2": ("GPT2LMHeadModel", lambda: transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                                n_positions=64, bos_token_id=1, eos_token_id=2,
                                                                layer_norm_epsilon=EPS)),
    "bert": ("BertForMaskedLM", lambda: transformers.BertConfig(**ENCODER, hidden_act="gelu_new")),
    "ernie": ("ErnieForMaskedLM", lambda: transformers.ErnieConfig(**ENCODER, use_task_id=True)),
    "roberta-prelayernorm": ("RobertaPreLayerNormForMaskedLM", lambda: transformers.RobertaPreLayerNormConfig(
        **{**ENCODER, "max_position_embeddings": 42})),
}
DECODERS = ("llama", "qwen2", "qwen3", "gpt2")
CLASSIFIERS = [("bert", "BertForSequenceClassification"), ("bert", "BertForTokenClassification"),
               ("ernie", "ErnieForSequenceClassification"), ("ernie", "ErnieForTokenClassification"),
               ("roberta-prelayernorm", "RobertaPreLayerNormForSequenceClassification"),
               ("roberta-prelayernorm", "RobertaPreLayerNormForTokenClassification")]


def _hf_model(arch: str, config, seed: int = 0):
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).eval()
    # A fresh init leaves norms at one and biases at zero; perturb every tensor so each mapped
    # weight is exercised.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _ids(batch: int = 3, seq: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids, **kwargs)
    return out if isinstance(out, torch.Tensor) else out.logits


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_round_trip_through_sampan_and_back(model_type, tmp_path):
    arch, make_config = CASES[model_type]
    hf = _hf_model(arch, make_config())
    hf.save_pretrained(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    # RoBERTa's position table has pad_token_id + 1 rows before position 0 that sampan drops.
    skipped = (hf.config.pad_token_id + 1) * hf.config.hidden_size if model_type == "roberta-prelayernorm" else 0
    assert not ours.training and ours.num_parameters() == sum(p.numel() for p in hf.parameters()) - skipped
    assert ours.num_parameters() == ours.config.num_parameters(type(ours).head)
    ids = _ids()
    expected = _logits(hf, ids)
    assert _diff(_logits(ours, ids), expected) < TOL

    if model_type in DECODERS:
        prompt = ids[:, :4]
        want = hf.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=2)
        got = ours.generate(prompt, max_new_tokens=8, eos_token_id=2, pad_token_id=0)
        assert torch.equal(got, want)

    ours.save_pretrained(tmp_path / "back", format="hf")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == model_type and config["architectures"] == [arch]
    back = getattr(transformers, arch).from_pretrained(tmp_path / "back").eval()
    assert _diff(_logits(back, ids), expected) < TOL
    # And sampan reads its own export again.
    assert _diff(_logits(from_pretrained(tmp_path / "back"), ids), expected) < TOL


@pytest.mark.parametrize("model_type, arch", CLASSIFIERS)
def test_classifiers_both_ways(model_type, arch, tmp_path):
    config = CASES[model_type][1]()
    config.num_labels = 3
    hf = _hf_model(arch, config)
    hf.save_pretrained(tmp_path / "hf")
    ours = from_pretrained(tmp_path / "hf")
    assert ours.config.num_labels == 3
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    expected = _logits(hf, ids, attention_mask=mask)
    assert _diff(_logits(ours, ids, attention_mask=mask), expected) < TOL
    ours.save_pretrained(tmp_path / "back", format="hf")
    back = getattr(transformers, arch).from_pretrained(tmp_path / "back").eval()
    assert _diff(_logits(back, ids, attention_mask=mask), expected) < TOL


def test_left_padded_generation_equals_transformers(tmp_path):
    hf = _hf_model("Qwen2ForCausalLM", CASES["qwen2"][1]())
    hf.save_pretrained(tmp_path)
    ours = from_pretrained(tmp_path)
    ids = _ids(3, 7)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    mask[2, :1] = 0
    ids = ids.masked_fill(mask == 0, 0)
    want = hf.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=2)
    got = ours.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=2, pad_token_id=0)
    assert torch.equal(got, want)


# -- sampan's own families, exported ---------------------------------------------------------------
OWN = {  # name -> (head, transformers class, a non-default norm epsilon in sampan's field name)
    "qwen2-tiny": ("causal_lm", "Qwen2ForCausalLM", {"rms_norm_eps": EPS}),
    "qwen3-tiny": ("causal_lm", "Qwen3ForCausalLM", {"rms_norm_eps": EPS}),
    "llama-tiny": ("causal_lm", "LlamaForCausalLM", {"rms_norm_eps": EPS}),
    "gpt-tiny": ("causal_lm", "GPT2LMHeadModel", {"layer_norm_eps": EPS}),
}


@pytest.mark.parametrize("name", sorted(OWN))
def test_sampan_models_open_in_transformers(name, tmp_path):
    head, arch, eps = OWN[name]
    torch.manual_seed(0)
    ours = sampan.models.create(name, vocab_size=VOCAB, max_position_embeddings=64, **eps).eval()
    ours.save_pretrained(tmp_path, format="hf", max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()  # sharded, with the index
    if ours.config.eos_token_id is not None:  # transformers' generate stops where sampan's does
        assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == ours.config.eos_token_id
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(hf).__name__ == arch
    ids = _ids()
    assert _diff(_logits(hf, ids), _logits(ours, ids)) < TOL


@pytest.mark.parametrize("name, head, arch", [
    ("ernie-tiny", "masked_lm", "BertForMaskedLM"),
    ("ernie-tiny", "sequence_classification", "BertForSequenceClassification"),
    ("ernie-tiny", "token_classification", "BertForTokenClassification"),
    ("ernie-tiny", "none", "BertModel"),
])
@pytest.mark.parametrize("pre_norm", [False, True])
def test_sampan_ernie_opens_in_transformers(name, head, arch, pre_norm, tmp_path):
    torch.manual_seed(0)
    ours = sampan.models.create(name, head=head, vocab_size=VOCAB, hidden_size=32, num_heads=4,
                                max_position_embeddings=40, num_labels=3, pre_norm=pre_norm,
                                layer_norm_eps=OWN_ENCODER_EPS).eval()
    ours.save_pretrained(tmp_path, format="hf")
    arch = arch.replace("Bert", "RobertaPreLayerNorm") if pre_norm else arch
    hf = getattr(transformers, arch).from_pretrained(tmp_path).eval()
    ids, mask = _ids(), torch.ones(3, 12, dtype=torch.long)
    mask[2, 6:] = 0
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask)
        mine = ours(ids, attention_mask=mask)
    theirs = theirs.last_hidden_state if head == "none" else theirs.logits
    mine = mine[0] if head == "none" else mine
    keep = mask.bool() if head == "none" else slice(None)
    assert _diff(mine[keep], theirs[keep]) < TOL


# -- files, dtypes and errors ------------------------------------------------------------------------
def test_stored_dtype_is_kept_unless_asked(tmp_path):
    hf = _hf_model("Qwen3ForCausalLM", CASES["qwen3"][1]()).to(torch.bfloat16)
    hf.save_pretrained(tmp_path)
    assert all(p.dtype == torch.bfloat16 for p in from_pretrained(tmp_path).parameters())
    as_fp32 = from_pretrained(tmp_path, dtype="float32")
    stored = hf.state_dict()
    for name, tensor in as_fp32.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, stored[name].float()), name


def test_sharded_and_pickle_checkpoints(tmp_path):
    hf = _hf_model("LlamaForCausalLM", CASES["llama"][1]())
    ids = _ids()
    expected = _logits(hf, ids)
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="30KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert _diff(_logits(from_pretrained(tmp_path / "sharded"), ids), expected) < TOL
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.json").write_text((tmp_path / "sharded" / "config.json").read_text())
    torch.save({k: v.clone() for k, v in hf.state_dict().items()}, legacy / "pytorch_model.bin")
    assert _diff(_logits(from_pretrained(legacy), ids), expected) < TOL


def test_pickle_with_code_is_refused(tmp_path):
    hf = _hf_model("Qwen2ForCausalLM", CASES["qwen2"][1]())
    hf.config.save_pretrained(tmp_path)
    # weights_only=True refuses anything but tensors and plain containers: an object that would
    # run code when unpickled never loads.
    torch.save({"model.embed_tokens.weight": torch.zeros(2), "payload": _Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(Exception, match="(?i)weights_only|unsupported|global"):
        from_pretrained(tmp_path)


class _Payload:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_unknown_model_type_key_and_missing_tensor_are_named(tmp_path):
    hf = _hf_model("LlamaForCausalLM", CASES["llama"][1]())
    hf.save_pretrained(tmp_path / "ok")
    config = json.loads((tmp_path / "ok" / "config.json").read_text())

    (tmp_path / "mamba").mkdir()
    (tmp_path / "mamba" / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    with pytest.raises(ValueError, match="model_type 'mamba' is not supported.*qwen2"):
        from_pretrained(tmp_path / "mamba")

    state = {k: v.clone() for k, v in hf.state_dict().items() if k != "model.layers.1.mlp.up_proj.weight"}
    state["model.layers.0.self_attn.rotary.weight"] = torch.zeros(1)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps(config))
    torch.save(state, tmp_path / "bad" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"missing \['model\.layers\.1\.mlp\.up_proj\.weight'\].*rotary\.weight"):
        from_pretrained(tmp_path / "bad")

    (tmp_path / "window").mkdir()
    (tmp_path / "window" / "config.json").write_text(json.dumps({**config, "model_type": "qwen2",
                                                                 "use_sliding_window": True}))
    with pytest.raises(ValueError, match="use_sliding_window"):
        from_pretrained(tmp_path / "window")


def test_export_refuses_what_hf_cannot_express(tmp_path):
    model = sampan.models.create("qwen2-tiny", qk_norm=True)
    with pytest.raises(ValueError, match="Qwen2 has no qk_norm"):
        model.save_pretrained(tmp_path / "x", format="hf")
    assert not (tmp_path / "x").exists()  # nothing half-written
    ernie = sampan.models.create("ernie-tiny", head="sequence_classification", classifier_pooling="mean",
                                 num_layers=1)
    with pytest.raises(ValueError, match="classifier_pooling='mean'"):
        ernie.save_pretrained(tmp_path / "e", format="hf")
    with pytest.raises(ValueError, match="format"):
        model.save_pretrained(tmp_path / "y", format="onnx")


def test_tokenizer_files_beside_the_model_give_autotokenizer_the_same_ids(tmp_path):
    from sampan.text import ChineseTokenizer, load_corpus

    tokenizer = ChineseTokenizer.train([d.text for d in load_corpus("news", "train")[:200]], vocab_size=600)
    texts = ["新华社北京电", "ＡＢＣ１９９８年，iPhone上市"]
    for name in ("llama-tiny", "qwen3-tiny", "gpt-tiny"):
        model = sampan.models.create(name, vocab_size=tokenizer.vocab_size, num_layers=1)
        model.save_pretrained(tmp_path / name, format="hf", tokenizer=tokenizer)
        auto = transformers.AutoTokenizer.from_pretrained(tmp_path / name)
        assert [auto(t)["input_ids"] for t in texts] == [tokenizer.encode(t).ids for t in texts], name
    # transformers reads a qwen2 directory's tokenizer as Qwen2Tokenizer whatever its config says:
    # a WordPiece tokenizer would encode other ids there, so it is refused, and nothing is written.
    qwen2 = sampan.models.create("qwen2-tiny", vocab_size=tokenizer.vocab_size, num_layers=1)
    with pytest.raises(ValueError, match="Qwen2Tokenizer.*WordPiece"):
        qwen2.save_pretrained(tmp_path / "qwen2", format="hf", tokenizer=tokenizer)
    assert not (tmp_path / "qwen2").exists()

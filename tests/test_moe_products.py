"""MoE models through the product paths: LoRA saved as a peft adapter (attention, dense / shared
MLPs and the routed experts' stacked weights), export to prefill + decode graphs, and generation.

LoRA: each MoE family's tiny model (Qwen3-MoE, Qwen2-MoE with its gated shared expert, ERNIE 4.5,
DeepSeek-V3 with MLA) gets LoRA with random updates, is saved as a peft adapter over its HF export,
and ``transformers`` + ``peft`` 0.21 must give sampan's logits (1e-4) and, merged, the same
expert weights as sampan's merge; `sampan finetune --task chat --method lora` of a tiny
Qwen3-MoE on attention and experts writes an adapter peft loads to the fine-tuned logits. Export: a random transformers
Qwen3-MoE (1 layer) is exported (full-window + prefill + decode graphs, ONNX and .pt2) and its
greedy tokens through ONNX Runtime and the .pt2 must equal eager generate with and without the
KV cache and transformers' generate; Taskflow's text_generation on that export continues a text
with eager's greedy tokens; `sampan serve` on a tiny Qwen3-MoE chat model answers
/v1/chat/completions with eager's greedy reply.

Cost: 28 s for the file on a quiet 2-core machine (the export 15 s, serving 4 s, the rest under
2 s each); 92 s while other jobs shared the cores.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from sampan.finetune.lora import LoRAExperts, apply_lora, merge_lora
from sampan.finetune.peft_format import load_peft_adapter, save_peft_adapter, without_lora
from sampan.models.registry import create

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
transformers.logging.set_verbosity_error()

ATTENTION = {"deepseek-v3-tiny": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]}
QWEN_ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
# Qwen2-MoE also takes its dense MLP and shared expert (peft does not rewrite qwen2_moe configs).
MLP = {"qwen2-moe-tiny": ["gate_proj", "up_proj", "down_proj"]}


def _randomise_updates(model, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)


@pytest.mark.parametrize("name", ["qwen3-moe-tiny", "qwen2-moe-tiny", "ernie4.5-moe-tiny", "deepseek-v3-tiny"])
def test_lora_on_attention_and_experts_runs_in_peft_with_sampans_logits(name, tmp_path):
    torch.manual_seed(0)
    model = create(name, vocab_size=96).eval()
    model.requires_grad_(False)
    targets = ATTENTION.get(name, QWEN_ATTENTION) + MLP.get(name, []) + ["experts"]
    names = apply_lora(model, targets, rank=2, alpha=4, within="")
    experts = [n for n in names if n.endswith(".experts")]
    assert experts and all(isinstance(model.get_submodule(n), LoRAExperts) for n in experts)
    _randomise_updates(model, seed=1)
    save_peft_adapter(model, tmp_path / "adapter", base_dir=tmp_path / "base")

    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["target_parameters"] == sorted(f"{n}.{p}" for n in experts for p in ("gate_up_proj", "down_proj"))
    ids = torch.randint(0, 96, (2, 10), generator=torch.Generator().manual_seed(2))
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    peft_model = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        ours = model(ids)
        assert (peft_model(input_ids=ids).logits - ours).abs().max().item() < 1e-4
        with without_lora(model):  # the update is real
            assert (model(ids) - ours).abs().max().item() > 1e-3
        merged_hf = peft_model.merge_and_unload()
        assert (merged_hf(input_ids=ids).logits - ours).abs().max().item() < 1e-4
        merged = copy.deepcopy(model)
        assert merge_lora(merged) == len(names)
        assert (merged(ids) - ours).abs().max().item() < 1e-5
        theirs = merged_hf.state_dict()
        for n in experts:
            for param in ("gate_up_proj", "down_proj"):
                key = f"{n}.{param}"
                torch.testing.assert_close(merged.state_dict()[key], theirs[key], rtol=0, atol=1e-6)
    # And back: a fresh model with the same LoRA layout reads the adapter to the same logits.
    fresh = create(name, vocab_size=96).eval()
    fresh.load_state_dict({k: v for k, v in model.state_dict().items() if ".lora_" not in k}, strict=False)
    apply_lora(fresh, targets, rank=2, alpha=4, within="")
    assert load_peft_adapter(fresh, tmp_path / "adapter") == len(names)
    with torch.no_grad():
        assert (fresh(ids) - ours).abs().max().item() < 1e-6


def test_lora_on_experts_only_and_refusals():
    torch.manual_seed(0)
    model = create("qwen3-moe-tiny", vocab_size=96)
    model.requires_grad_(False)
    with pytest.raises(ValueError, match="no dropout"):
        apply_lora(model, ["experts"], rank=2, alpha=4, dropout=0.1, within="")
    names = apply_lora(model, ["experts.down_proj"], rank=2, alpha=4, within="")
    layer = model.get_submodule(names[0])
    assert layer.adapted_params == ("down_proj",) and not any("gate_up_proj" in k for k in layer.lora_A)
    # Only the factors train; the base names stay, so a base checkpoint loads unchanged.
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert trainable == sorted(f"{n}.lora_{ab}.down_proj" for n in names for ab in "AB")
    assert f"{names[0]}.down_proj" in model.state_dict()
    dense = create("qwen3-tiny", vocab_size=96)
    with pytest.raises(ValueError, match="no MoE block"):
        apply_lora(dense, ["experts"], rank=2, alpha=4, within="")


def test_lora_on_mlp_projections_peft_would_misread_is_refused(tmp_path):
    # peft 0.21 rewrites target_modules named gate_proj / up_proj / down_proj on transformers 5's
    # qwen3_moe into the routed experts: an adapter on the dense MLP would load onto the experts.
    model = create("qwen3-moe-tiny", vocab_size=96)
    model.requires_grad_(False)
    apply_lora(model, ["q_proj", "down_proj"], rank=2, alpha=4, within="")
    with pytest.raises(ValueError, match="peft 0.21 reads target modules named gate_proj"):
        save_peft_adapter(model, tmp_path / "adapter")
    assert not (tmp_path / "adapter").exists()


VOCAB = 96
PROMPTS = [[5, 17, 33, 2, 90, 11, 7], [44, 12, 9]]  # unequal: the second is left-padded
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    """A random transformers Qwen3-MoE (weights perturbed so greedy decoding wanders), sampan's
    twin from the HF loader, and its export (full-window + prefill + decode graphs)."""
    from sampan.inference import export_pretrained
    from sampan.models import from_pretrained
    from sampan.taskflow import runtime
    from sampan.text.tokenizer import ChineseTokenizer
    from sampan.utils.paths import cache_dir

    root = tmp_path_factory.mktemp("moe-export")
    config = transformers.Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                         num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                                         tie_word_embeddings=False, eos_token_id=None)
    torch.manual_seed(0)
    hf = transformers.Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(root / "hf")
    # Taskflow's text_generation reads sampan's character tokenizer ([CLS] prompt, [SEP] ends).
    ChineseTokenizer.train(["话说天下大势分久必合合久必分周末七国分争并入于秦"] * 2, vocab_size=VOCAB,
                           min_frequency=1).save(root / "hf" / "tokenizer.json")
    ours = from_pretrained(root / "hf").eval()
    # Exported once, where Taskflow's runtime looks for its export of this directory (its cache,
    # here under tmp). verify=False: the tokens test checks the graphs on both backends itself
    # (the export's own check would run them all once more, ~50 s).
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SAMPAN_CACHE", str(root / "cache"))
        target = cache_dir("inference", f"{root.joinpath('hf').name}-{runtime._digest(root / 'hf')}")
        export = export_pretrained(ours, target, task="text_generation", verify=False)
    return {"hf": hf, "ours": ours, "dir": export, "model_dir": root / "hf", "cache": root / "cache"}


def test_moe_export_has_onnx_decode_graphs_whose_greedy_tokens_equal_eager_and_transformers(qwen3_moe):
    from sampan.inference import Config, Generator, create_generator

    top = json.loads((qwen3_moe["dir"] / "inference.json").read_text())
    assert top["decode_graphs"]["num_layers"] == 1
    for sub in (".", "prefill", "decode"):
        assert (qwen3_moe["dir"] / sub / "inference.onnx").is_file(), sub  # ONNX, not only the .pt2
        assert json.loads((qwen3_moe["dir"] / sub / "inference.json").read_text())["onnx_error"] is None
    width = max(len(p) for p in PROMPTS)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    want = qwen3_moe["hf"].generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                    pad_token_id=0)[:, width:].tolist()
    assert len(set(want[0])) >= 6 and want[0] != want[1]  # a path that moves, so equality means something
    for use_cache in (True, False):
        eager = qwen3_moe["ours"].generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, use_cache=use_cache)
        assert eager[:, width:].tolist() == want, f"use_cache={use_cache}"
    runs = {"onnxruntime": create_generator(Config(qwen3_moe["dir"])),
            "torch": create_generator(Config(qwen3_moe["dir"], backend="torch")),
            "eager": Generator.from_model(qwen3_moe["ours"])}
    for backend, generator in runs.items():
        assert [o.token_ids for o in generator.generate(PROMPTS, max_tokens=NEW_TOKENS)] == want, backend


CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


WORDS = ["你好", "谢谢", "天气", "很好", "房间", "干净", "服务", "不错"]


@pytest.fixture(scope="module")
def chat_moe(tmp_path_factory):
    """A tiny random transformers Qwen3-MoE with a byte-level BPE tokenizer and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    base = tmp_path_factory.mktemp("chat-moe")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(WORDS * 4 + ["system user assistant"], trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(base / "tokenizer.json"))
    (base / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHATML}))
    config = transformers.Qwen3MoeConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                         moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                         max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=2,
                                         pad_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(base)
    return base


def test_chat_lora_fine_tune_on_attention_and_experts_writes_an_adapter_peft_loads(chat_moe, tmp_path):
    from sampan.cli import main
    from sampan.finetune.causal_lm import load_chat_model

    base, words = chat_moe, WORDS
    data = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": a + b}, {"role": "assistant", "content": b + a}]}
            for a in words for b in words]
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    out = tmp_path / "lora"
    code = main(["finetune", "--task", "chat", "--model", str(base), "--data", str(data), "--method", "lora",
                 "--lora-rank", "4", "--lora-targets", "attention,experts", "--max-length", "64", "--steps", "4",
                 "--batch-size", "8", "--learning-rate", "1e-2", "--output-dir", str(out),
                 "--training.progress_bar", "false"])
    assert code == 0
    meta = json.loads((out / "task.json").read_text())
    assert meta["metrics"]["loss"] < meta["initial_dev_metrics"]["loss"]
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["target_parameters"] and all(t.startswith("model.layers.") for t in adapter["target_parameters"])
    model, tokenizer, meta = load_chat_model(out)
    assert meta["method"] == "lora" and "experts" in meta["method_args"]["lora_targets"]
    ids = torch.tensor([tokenizer.apply_chat_template([{"role": "user", "content": "房间干净"}],
                                                      add_generation_prompt=True)])
    with torch.no_grad():
        ours = model(ids)
        peft_model = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base),
                                                    out / "adapter").eval()
        assert (peft_model(input_ids=ids).logits - ours).abs().max().item() < 1e-4
        merged_hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()  # merged weights, HF format
        assert (merged_hf(input_ids=ids).logits - ours).abs().max().item() < 1e-4


@pytest.mark.multiprocess
def test_serve_answers_chat_completions_on_an_moe_model_with_eager_greedy_tokens(chat_moe):
    import openai

    from sampan.models import from_pretrained
    from sampan.server_process import ServerProcess
    from sampan.text import PretrainedTokenizer

    tokenizer = PretrainedTokenizer.from_pretrained(chat_moe)
    messages = [{"role": "user", "content": "房间干净"}]
    ids = torch.tensor([tokenizer.apply_chat_template(messages, add_generation_prompt=True)])
    eos = tokenizer.token_to_id("<|im_end|>")
    model = from_pretrained(chat_moe).eval()
    want = model.generate(ids, max_new_tokens=8, eos_token_id=eos)[0, ids.shape[1]:].tolist()
    want = want[: want.index(eos)] if eos in want else want
    assert len(want) >= 3  # a reply of some length, so equality means something
    args = ["--model", str(chat_moe), "--served-model-name", "moe", "--device", "cpu", "--num-threads", "1",
            "--log-level", "warning"]
    with ServerProcess(args, startup_timeout_s=120) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)
        reply = client.chat.completions.create(model="moe", messages=messages, max_tokens=8, temperature=0)
    assert reply.choices[0].message.content == tokenizer.decode(want, skip_special_tokens=True)
    assert reply.usage.prompt_tokens == ids.shape[1]


def test_taskflow_text_generation_on_an_moe_model_continues_with_eager_greedy_tokens(qwen3_moe, monkeypatch):
    from sampan.taskflow import Taskflow
    from sampan.text.tokenizer import CLS_ID, MASK_ID, PAD_ID, SEP_ID, UNK_ID, ChineseTokenizer

    monkeypatch.setenv("SAMPAN_CACHE", str(qwen3_moe["cache"]))  # the export the fixture made
    flow = Taskflow("text_generation", model=str(qwen3_moe["model_dir"]), top_k=1, repetition_penalty=1.0,
                    max_new_tokens=10, min_new_tokens=10, seed=0)
    (result,) = flow("话说天下")
    tokenizer = ChineseTokenizer.load(qwen3_moe["model_dir"] / "tokenizer.json")
    row = [CLS_ID, *tokenizer.encode("话说天下", add_special_tokens=False).ids]
    new = []
    with torch.no_grad():  # eager greedy over the tokens the task never writes
        for _ in range(10):
            logits = qwen3_moe["ours"](torch.tensor([row]))[0, -1]
            logits[[PAD_ID, UNK_ID, CLS_ID, MASK_ID, SEP_ID]] = float("-inf")
            row.append(int(logits.argmax()))
            new.append(row[-1])
    assert result == {"text": "话说天下", "generated": tokenizer.decode(new)}
    assert len(set(new)) >= 3

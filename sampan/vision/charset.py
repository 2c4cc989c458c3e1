"""The recogniser's character set: printable ASCII, common full-width punctuation and symbols, GB2312's
3,755 level-1 characters and every Han character of the corpora, in a stable order, saved as a text
file (one character a line) whose SHA-256 the data manifest records.

The order is fixed by construction, not by frequency: ASCII, then the punctuation table below, then
GB2312 level 1 in GB2312's own (pinyin) order, then the corpora's other Han characters by code point.
A character's index therefore changes only when the corpora gain a Han character GB2312 lacks, and
the checksum says when that happened.
"""

from __future__ import annotations

import hashlib
import os
import unicodedata
from collections.abc import Iterable
from pathlib import Path

from sampan.utils.atomic import atomic_write

ASCII = "".join(chr(c) for c in range(0x20, 0x7F))  # space included: Latin text has it
# Chinese punctuation and symbols that printed Chinese uses. Full-width letters and digits are not
# here: normalize_text folds them to ASCII, since they look alike and one label per look is what a
# CTC recogniser can learn.
FULLWIDTH = ("，。、；：？！…—·“”‘’（）《》〈〉【】「」『』〔〕［］｛｝～／＼＿＂＇＃＄％＆＊＋－＝＜＞＠＾｀｜"
             "¥￥°℃‰×÷±№§※→←↑↓①②③④⑤⑥⑦⑧⑨⑩〇")
# GB2312 level 1: rows 16-55, 94 cells a row except row 55's last five (3,755 characters).
GB2312_LEVEL1 = "".join(bytes([row + 0xA0, cell + 0xA0]).decode("gb2312")
                        for row in range(16, 56) for cell in range(1, 95) if not (row == 55 and cell > 89))
_FOLD = {c: chr(c - 0xFEE0) for c in (*range(0xFF10, 0xFF1A), *range(0xFF21, 0xFF3B), *range(0xFF41, 0xFF5B))}


def normalize_text(text: str) -> str:
    """The text as rendered and labelled: full-width digits and letters folded to ASCII, other
    whitespace runs to one space, ends stripped."""
    return " ".join(text.translate(_FOLD).split())


def is_han(char: str) -> bool:
    """A CJK unified ideograph of the Basic Multilingual Plane (U+4E00-U+9FFF), the block every
    CJK font here covers; rarer blocks are left out of the charset (and lines using them skipped)."""
    return "\u4e00" <= char <= "\u9fff"


def build_charset(texts: Iterable[str]) -> list[str]:
    """The character set for ``texts`` (the corpora's documents): see the module docstring."""
    chars = list(dict.fromkeys(ASCII + FULLWIDTH + GB2312_LEVEL1))
    known = set(chars)
    extra = {c for text in texts for c in normalize_text(text) if is_han(c) and c not in known}
    return chars + sorted(extra)


def charset_text(chars: list[str]) -> str:
    """The file form: one character a line (the space is a line holding one space)."""
    return "".join(c + "\n" for c in chars)


def charset_sha256(chars: list[str]) -> str:
    return hashlib.sha256(charset_text(chars).encode("utf-8")).hexdigest()


def save_charset(chars: list[str], path: str | os.PathLike) -> str:
    """Write the charset atomically; returns its SHA-256."""
    if len(set(chars)) != len(chars) or any(len(c) != 1 or c == "\n" for c in chars):
        raise ValueError("a charset is distinct single characters, no newline")
    atomic_write(path, charset_text(chars).encode("utf-8"))
    return charset_sha256(chars)


def load_charset(path: str | os.PathLike, sha256: str | None = None) -> list[str]:
    """Read a charset file; with ``sha256`` (the manifest's), check it is the one the data used."""
    data = Path(path).read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ValueError(f"{path}: SHA-256 {hashlib.sha256(data).hexdigest()} is not the manifest's {sha256}; "
                         "the charset changed since the data was built: rebuild the data or use its charset.txt")
    text = data.decode("utf-8")
    if not text.endswith("\n"):
        raise ValueError(f"{path}: not a charset file (one character a line, each ending in a newline)")
    chars = text[:-1].split("\n")
    bad = [c for c in chars if len(c) != 1]
    if bad:
        raise ValueError(f"{path}: lines {bad[:3]} are not one character each")
    return chars


def unsupported(text: str, charset: set[str] | frozenset[str]) -> list[str]:
    """The characters of ``text`` outside ``charset`` (in order, once each)."""
    return list(dict.fromkeys(c for c in text if c not in charset))


def category_counts(chars: list[str]) -> dict[str, int]:
    """How many characters of each kind, for the manifest."""
    gb = set(GB2312_LEVEL1)
    return {"total": len(chars), "ascii": sum(c in ASCII for c in chars), "gb2312_level1": sum(c in gb for c in chars),
            "other_han": sum(is_han(c) and c not in gb for c in chars),
            "other": sum(not is_han(c) and c not in ASCII and unicodedata.category(c) != "Cc" for c in chars)}

"""Chinese prose out of documentation markup: paragraphs from HTML / XHTML / XHP / DocBook, man pages
and plain or fortune text, normalised and filtered to the Han-majority ones.

Used by the ``debian-zh`` corpus (``sampan.text.corpus.debian_zh``); nothing here knows about
packages. Each reader returns the paragraphs of one file in reading order, after ``normalise``,
before any filtering: ``keep_paragraph`` and ``ProseFilter`` decide what is prose.

What goes before a paragraph is even considered: script / style / code blocks (``pre``,
``programlisting``, ``screen``, man ``.nf`` / ``.EX`` blocks), navigation (``nav``, headers,
footers, tables of contents, breadcrumbs), XHP bookmarks, comments and platform variants, image
alternative texts, URLs and e-mail addresses. Inline code (``<code>ls</code>`` inside a sentence)
stays: modern technical Chinese names commands and keys in Latin letters within its sentences, and
cutting them out would leave broken sentences; a paragraph that is mostly code fails the Han
ratio instead.
"""

from __future__ import annotations

import dataclasses
import gzip
import html
import re
from html.parser import HTMLParser

# CJK Unified Ideographs, Extension A and the compatibility block: what "Han" counts.
HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_HAN = re.compile(f"[{HAN}]")
# Full-width and CJK punctuation that sits against Han characters without spaces.
_CJK_PUNCT = "\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65\u2018\u2019\u201c\u201d\u2014\u2026\u00b7"
_TIGHT = f"{HAN}{_CJK_PUNCT}"


@dataclasses.dataclass(frozen=True)
class ProseFilter:
    """Which normalised paragraphs count as Chinese prose.

    Fields:
        min_han: the fewest Han characters a paragraph needs (shorter ones are headings, table
            cells, menu names and labels, not prose).
        min_han_ratio: the least ``han_share`` of a paragraph: Han characters among its
            non-space characters, a run of ASCII (a command, a path, an option, an English word)
            counting as one. Chinese punctuation counts against it, so plain prose scores ~0.85;
            a technical sentence naming a few commands and paths stays above 0.6; an option list
            or an English passage with a Chinese clause falls below. (Counting ASCII per
            character instead would drop most of the Debian reference: its sentences are Chinese
            but "/etc/apt/sources.list" alone is 21 characters.)
        min_sentence_han: a paragraph with fewer than ``min_han`` Han characters is still kept when
            it is a whole sentence (ends in 。！？, maybe inside a closing quote) with at least this
            many; headings, menu paths and table cells carry no sentence end. 0 turns this off.
    """

    min_han: int = 20
    min_han_ratio: float = 0.6
    min_sentence_han: int = 10

    def __post_init__(self) -> None:
        if self.min_han < 1:
            raise ValueError(f"min_han must be >= 1, got {self.min_han}")
        if not 0.0 < self.min_han_ratio <= 1.0:
            raise ValueError(f"min_han_ratio must be in (0, 1], got {self.min_han_ratio}")
        if not 0 <= self.min_sentence_han <= self.min_han:
            raise ValueError(f"min_sentence_han must be in [0, min_han={self.min_han}], got {self.min_sentence_han}")

    def keep(self, paragraph: str) -> bool:
        """Whether ``paragraph`` (already normalised) is Chinese prose under these thresholds."""
        han = han_count(paragraph)
        if han < self.min_han and not (self.min_sentence_han and han >= self.min_sentence_han
                                       and _SENTENCE_END.search(paragraph)):
            return False
        return han_share(paragraph) >= self.min_han_ratio


_SENTENCE_END = re.compile("[。！？][”’）]?$")


def han_count(text: str) -> int:
    """How many Han characters ``text`` holds."""
    return len(_HAN.findall(text))


_ASCII_RUN = re.compile(r"[!-~]+")


def han_share(text: str) -> float:
    """Han characters among the non-space characters of ``text``, each run of printable ASCII (a
    word, a number, a path, an option) counted as one character: ``"用 apt 安装"`` is 4 / 5."""
    han = han_count(text)
    runs = len(_ASCII_RUN.findall(text))
    other = len(_ASCII_RUN.sub("", text)) - text.count(" ") - han
    units = han + runs + other
    return han / units if units else 0.0


def han_skeleton(text: str) -> str:
    """Only the Han characters of ``text``: two paragraphs with one skeleton differ only in numbers,
    Latin words or punctuation (a version, a command name, a page number), so they are one text."""
    return "".join(_HAN.findall(text))


# ---------------------------------------------------------------------------------------------
# Normalisation

_URL = re.compile(r"(?:https?|ftp)://[^\s<>\"'（）]+|www\.[^\s<>\"'（）]+|mailto:\S+|[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad"), None)
# Full-width ASCII letters and digits become half-width (ａ１ -> a1), and the ideographic space a
# space; punctuation stays full-width.
_HALF = {c: c - 0xFEE0 for c in [*range(0xFF10, 0xFF1A), *range(0xFF21, 0xFF3B), *range(0xFF41, 0xFF5B)]}
_HALF |= {0x3000: 0x20, 0xA0: 0x20, 0x2002: 0x20, 0x2003: 0x20, 0x2009: 0x20, 0x202F: 0x20}
_HALF |= {ord("「"): "“", ord("」"): "”", ord("『"): "‘", ord("』"): "’"}
# ASCII punctuation right after a Han character (or after CJK punctuation) is the Chinese one typed
# on an English keyboard: 注意: -> 注意：. A full stop only at a sentence end (not 6.0, a.b).
_AFTER_HAN = {",": "，", ";": "；", ":": "：", "?": "？", "!": "！"}
_HALF_PUNCT = re.compile(f"(?<=[{_TIGHT}]) ?([,;:?!])(?![0-9A-Za-z/\\\\])")
_FULL_STOP = re.compile(f"(?<=[{HAN}])\\.(?=\\s|$|[{_TIGHT}])")
_PARENS = re.compile(f"\\(([^()]*[{HAN}][^()]*)\\)")
_SPACE = re.compile(r"\s+")
_SPACE_BETWEEN = re.compile(f"(?<=[{_TIGHT}]) (?=[{_TIGHT}])")
_SPACE_AROUND_PUNCT = re.compile("(?<=[，。：；？！、（）“”‘’《》【】…]) | (?=[，。：；？！、（）“”‘’《》【】…])")
_EMPTY_BRACKETS = re.compile(r"（\s*）|\(\s*\)|<\s*>|\[\s*\]")


def normalise(text: str) -> str:
    """One paragraph's text in the corpus's one form.

    Whitespace collapses to single spaces and disappears between Han characters and Chinese
    punctuation (a line break inside a Chinese sentence is not a space); full-width letters and
    digits become ASCII; ASCII ``, ; : ? !`` and a sentence-final ``.`` right after Han text become
    their full-width forms, and parentheses around Han text become （）; corner quotes 「」『』
    become “”‘’ (the mainland form, GB/T 15834); URLs, e-mail addresses and invisible characters go.
    """
    text = html.unescape(text) if "&" in text else text
    text = text.translate(_INVISIBLE).translate(_HALF)
    text = _URL.sub("", text)
    text = _SPACE.sub(" ", text).strip()
    text = _HALF_PUNCT.sub(lambda m: _AFTER_HAN[m.group(1)], text)
    text = _FULL_STOP.sub("。", text)
    text = _PARENS.sub(r"（\1）", text)
    text = _EMPTY_BRACKETS.sub("", text)
    text = _SPACE_BETWEEN.sub("", text)
    text = _SPACE_AROUND_PUNCT.sub("", text)
    return _SPACE.sub(" ", text).strip()


# ---------------------------------------------------------------------------------------------
# HTML, XHTML, XHP and DocBook

# Elements whose whole content is not prose.
_SKIP_HTML = frozenset({"script", "style", "pre", "head", "nav", "header", "footer", "aside", "noscript", "svg",
                        "math", "button", "select", "textarea", "form", "object", "map", "template", "iframe"})
_SKIP_XML = frozenset({
    # DocBook: code and literal layouts, index terms, metadata
    "programlisting", "screen", "synopsis", "cmdsynopsis", "funcsynopsis", "literallayout", "indexterm",
    "info", "bookinfo", "articleinfo", "remark", "address",
    # LibreOffice XHP: the help index (bookmarks), page metadata, platform variants, image text
    "bookmark", "bookmark_value", "comment", "meta", "caseinline", "case", "alt", "history", "sort",
    "embed", "embedvar", "image", "object", "script", "style",
})
# A class (HTML) or role (XHP) token that marks navigation or code; matched as whole tokens, and
# never on <html> / <body> (asciidoctor's <body class="book toc2 toc-left"> holds the whole page).
_SKIP_CLASS = re.compile(r"nav\w*|toc\d*|contents|breadcrumbs?|footer|header|sidebar|screen|programlisting|synopsis|"
                         r"code|highlight|sourcecode|literallayout|listingblock|example-code", re.IGNORECASE)
# texinfo's HTML (LilyPond) puts its table of contents and language list in these.
_SKIP_ID = frozenset({"navigation", "nav", "toc", "tocframe", "languages", "footer", "header", "sidebar",
                      "breadcrumbs"})
_NEVER_SKIP = frozenset({"html", "body", "main"})
# Elements that end a paragraph (HTML and the XML vocabularies together).
_BLOCK = frozenset({
    "p", "div", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "td", "th", "tr", "table",
    "tbody", "thead", "caption", "blockquote", "br", "hr", "section", "article", "main", "figure", "figcaption",
    "body", "html", "center", "address", "details", "summary", "title",
    "para", "simpara", "formalpara", "listitem", "entry", "row", "term", "varlistentry", "note", "tip",
    "warning", "caution", "important", "chapter", "sect1", "sect2", "sect3", "sect4", "refsect1", "refsect2",
    "paragraph", "tablecell", "tablerow", "list", "variable", "switch", "h7",
})
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "area", "base", "col", "embed", "source", "wbr",
                   "param", "track"})


class _ProseParser(HTMLParser):
    """Collects the text of block elements, leaving out the skipped ones (see the module docstring)."""

    def __init__(self, xml: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.xml = xml
        self.skip_tags = _SKIP_HTML | (_SKIP_XML if xml else frozenset())
        self.void = frozenset() if xml else _VOID
        self.skipping: list[list] = []  # [tag, nesting] of the element being skipped, innermost last
        self.paragraphs: list[str] = []
        self.current: list[str] = []

    def _skip_this(self, tag: str, attrs: list[tuple[str, str | None]]) -> bool:
        if tag in self.skip_tags:
            return True
        if tag in _NEVER_SKIP:
            return False
        names = {name for name, _ in attrs}
        if "hidden" in names and "class" in names:
            # LibreOffice's help renders XHP's platform / module variants (Command on a Mac, Ctrl
            # elsewhere; a Writer and a Calc wording) as hidden spans of that class, the default as a
            # hidden span with none, and lets a script show one: keep the default, as for XHP.
            return True
        for name, value in attrs:
            if not value:
                continue
            if name in ("class", "role") and any(_SKIP_CLASS.fullmatch(token) for token in value.split()):
                return True
            if name == "id" and value.lower() in _SKIP_ID:
                return True
        return False

    def _flush(self) -> None:
        text = normalise("".join(self.current))
        self.current = []
        if text:
            self.paragraphs.append(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.skipping:
            if tag == self.skipping[-1][0] and tag not in self.void:
                self.skipping[-1][1] += 1
            return
        if tag in _BLOCK:
            self._flush()
        if tag not in self.void and self._skip_this(tag, attrs):
            self.skipping.append([tag, 1])

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if not self.skipping and tag in _BLOCK:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if self.skipping:
            if tag == self.skipping[-1][0]:
                self.skipping[-1][1] -= 1
                if self.skipping[-1][1] == 0:
                    self.skipping.pop()
            return
        if tag in _BLOCK:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.current.append(data)

    def close(self) -> None:
        super().close()
        self._flush()


def markup_paragraphs(text: str, xml: bool = False) -> list[str]:
    """The normalised paragraphs of an HTML / XHTML page (``xml=False``) or of an XHP / DocBook
    file (``xml=True``: its code, bookmark and metadata elements are skipped as well)."""
    parser = _ProseParser(xml)
    parser.feed(text)
    parser.close()
    return parser.paragraphs


# ---------------------------------------------------------------------------------------------
# Man pages (groff man macros)

_NAMED_GLYPHS = {"em": "—", "en": "–", "hy": "-", "co": "©", "rg": "®", "lq": "“", "rq": "”", "oq": "‘", "cq": "’",
                 "aq": "'", "dq": '"', "bu": "·", "mu": "×", "->": "→", "<-": "←", "tm": "™", "de": "°",
                 "ti": "~", "ha": "^", "ba": "|", "rs": "\\", "sl": "/", "fm": "′", "pl": "+", "mi": "-",
                 "eq": "=", "lh": "", "rh": "", "dg": "†"}
_ESCAPE = re.compile(r"\\(?:f(?:\[[^\]]*\]|\(..|.)|s[-+]?(?:\d|\(\d\d|\[\d+\])|\((..)|\[([^\]]*)\]|\*(?:\(..|\[[^\]]*\]|.)|"
                     r"[kgnz]\(?.?.?|[hvwlLbBDoXxSZ]'[^']*'|(.))")
_FONT_MACROS = {"B", "I", "SM", "SB"}  # arguments joined by spaces
_ALTERNATING = {"BR", "RB", "IR", "RI", "BI", "IB"}  # arguments joined without spaces
_BREAKS = {"PP", "P", "LP", "TP", "TQ", "IP", "HP", "SH", "SS", "sp", "br", "RS", "RE", "in", "ti", "bp", "ne",
           "Pp", "Sh", "Ss", "Bl", "El", "It", "Bd", "Ed", "Dl"}
_CODE_START = {"nf": "fi", "EX": "EE", "Vb": "Ve", "ig": "..", "de": "..", "am": "..", "TS": "TE", "EQ": "EN",
               "PS": "PE"}


_HAND_LAID = re.compile(r"(?:\t| {2,})|\s.*\S {3,}\S")


def _unescape_groff(text: str) -> str:
    def one(m: re.Match) -> str:
        glyph = m.group(1) or m.group(2)
        if glyph is not None:
            return _NAMED_GLYPHS.get(glyph, "")
        char = m.group(3)
        if char is None:
            return ""
        return {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "'": "'", "`": "`", ".": ".",
                "\"": ""}.get(char, "")

    return _ESCAPE.sub(one, text)


def _macro_args(rest: str) -> list[str]:
    """A macro line's arguments: space-separated, double quotes group."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"|\S+', rest)]


def man_paragraphs(source: str) -> list[str]:
    """The normalised paragraphs of a groff man page: running text and the arguments of font
    macros (``.B``, ``.BR``...), with comments, macro definitions, ``.nf`` / ``.EX`` / ``.TS`` blocks
    (examples, tables), indented or column-aligned lines (laid out by hand) and the title line left out; a ``.TP`` tag (the option it describes) is a
    paragraph of its own, so the Han filter drops it."""
    paragraphs: list[str] = []
    current: list[str] = []
    closing: str | None = None

    def flush() -> None:
        text = normalise(_unescape_groff(" ".join(current)))
        current.clear()
        if text:
            paragraphs.append(text)

    lines = source.splitlines()
    tag_next = False
    for line in lines:
        if closing is not None:
            if line.strip().lstrip(".'").split()[:1] == [closing.strip(".")] or line.strip() == closing:
                closing = None
            continue
        line = re.sub(r'\\".*', "", line)  # comment to the end of the line
        if line[:1] in (".", "'"):
            parts = line[1:].strip().split(None, 1)
            if not parts:
                continue
            macro, rest = parts[0], (parts[1] if len(parts) > 1 else "")
            if macro in _CODE_START:
                flush()
                closing = _CODE_START[macro]
                continue
            if macro in ("TH", "Dt", "Dd", "Os", "so"):
                continue
            if macro in _BREAKS:
                flush()
                # .SH/.SS carry their heading; .IP carries its tag: both stand alone.
                if macro in ("SH", "SS", "Sh", "Ss") and rest:
                    current.append(" ".join(_macro_args(rest)))
                    flush()
                tag_next = macro in ("TP", "TQ")
                continue
            if macro in _FONT_MACROS:
                current.append(" ".join(_macro_args(rest)))
            elif macro in _ALTERNATING:
                current.append("".join(_macro_args(rest)))
            # any other request (.ft, .ad, .ds, mdoc inline macros...) carries no prose
        elif not line.strip():
            flush()
            continue
        elif _HAND_LAID.match(line):
            # groff sets a line that starts with a space as it stands: hand-laid tables and examples
            # are indented further or aligned in columns (the PostgreSQL pages start every prose
            # line with a single space, so one space alone is not enough)
            flush()
            continue
        else:
            current.append(line)
        if tag_next:
            flush()
            tag_next = False
    flush()
    return paragraphs


def read_man(data: bytes) -> list[str]:
    """``man_paragraphs`` of a man page file's bytes, gzipped or not."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return man_paragraphs(data.decode("utf-8", errors="replace"))


# ---------------------------------------------------------------------------------------------
# Plain text and fortune files

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ATTRIBUTION = re.compile(r"^\s*(?:--|——|―)")


def text_paragraphs(text: str) -> list[str]:
    """The normalised paragraphs of plain text: blank lines separate paragraphs, line breaks inside
    one join (without a space between Han characters); terminal colour codes and attribution
    lines (``-- 《道德经》``) go."""
    text = _ANSI.sub("", text)
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip() and not _ATTRIBUTION.match(line)]
        para = normalise(" ".join(lines))
        if para:
            paragraphs.append(para)
    return paragraphs


_COLOURED_LINE = re.compile(r"(?m)^\s*\x1b\[.*$")


def fortune_entries(text: str) -> list[str]:
    """The entries of a fortune file (separated by lines holding only ``%``), each as one
    normalised paragraph (a poem's lines join into one). fortunes-zh prints a poem's title and
    author, a quotation's source and an excerpt's heading in colour: those lines (starting with a
    terminal colour code) are metadata, not text, and go."""
    entries = []
    for entry in re.split(r"(?m)^%\s*$", text):
        para = " ".join(text_paragraphs(_COLOURED_LINE.sub("", entry)))
        para = normalise(para)
        if para:
            entries.append(para)
    return entries

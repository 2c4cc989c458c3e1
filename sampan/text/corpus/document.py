"""``Document``: one text with a stable id and optional gold annotation; seeded held-out splits."""

from __future__ import annotations

import dataclasses
import hashlib

# Gold entity labels (People's Daily tags nr / ns / nt).
ENTITY_LABELS = ("PER", "LOC", "ORG")


@dataclasses.dataclass(frozen=True)
class Document:
    """A text from a corpus.

    Fields:
        id: stable across runs and machines (derived from the source position or the content),
            so a split or a data build can name exactly what it used.
        text: the text.
        words: gold word spans ``(start, end)`` as character offsets into ``text`` (empty when
            the corpus has no gold segmentation).
        entities: gold entity spans ``(start, end, label)``, label in ``ENTITY_LABELS``.
        label: a document label (review sentiment "pos" / "neg"), or None.
    """

    id: str
    text: str
    words: tuple[tuple[int, int], ...] = ()
    entities: tuple[tuple[int, int, str], ...] = ()
    label: str | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("Document.id must be a non-empty string")
        n = len(self.text)
        for start, end in self.words:
            if not 0 <= start < end <= n:
                raise ValueError(f"document {self.id}: word span ({start}, {end}) outside the text (length {n})")
        for start, end, label in self.entities:
            if not 0 <= start < end <= n or label not in ENTITY_LABELS:
                raise ValueError(f"document {self.id}: bad entity span ({start}, {end}, {label!r}); "
                                 f"labels are {list(ENTITY_LABELS)}")


SPLITS = ("train", "test", "all")


def held_out(doc_id: str, fraction: float, seed: int = 0) -> bool:
    """Whether ``doc_id`` falls in the held-out part of a ``fraction`` split under ``seed``.

    A hash of (seed, id), not a shuffle: a document's side never changes when the corpus grows,
    shrinks or is read in another order, and no list of ids needs storing.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"held-out fraction must be in [0, 1), got {fraction}")
    digest = hashlib.blake2b(f"{seed}:{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < fraction


def select_split(docs: list[Document], split: str, fraction: float, seed: int = 0) -> list[Document]:
    """The ``split`` ("train", "test" = held out, or "all") of ``docs`` under a seeded hash split."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    if split == "all":
        return list(docs)
    want = split == "test"
    return [d for d in docs if held_out(d.id, fraction, seed) == want]

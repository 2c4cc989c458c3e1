"""``did_you_mean``: the closest known name for a misspelt one, for error messages."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the choice closest to ``name`` (difflib's ratio of at least
    0.6), or ``""`` when none is that close or ``name`` is not a string; meant to sit in front of
    the message's list of what there is."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"did you mean {close[0]!r}? " if close else ""

"""``KEY=VALUE`` settings from the command line and YAML values: one reader for every verb.

``--set``, ``--override``, ``--option``, ``--task-option``, ``--fix``, ``--model-shape`` and
``sampan hub build --set`` all take ``KEY=VALUE`` strings. They share this module, so they split,
read booleans and report a malformed pair the same way:

- a value is read as YAML (``3`` an int, ``3e-4`` a float, ``true`` a bool, ``null`` None,
  ``[1, 2]`` a list), with YAML 1.2's floats, or typed by a dataclass field's default;
- booleans are ``true / false``, ``yes / no``, ``on / off`` or ``1 / 0``, in any case;
- a pair without ``=`` or without a key is an error naming the flag and showing an example.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")

# YAML 1.1 (PyYAML) needs a dot in a float ("3.0e-4"); YAML 1.2 and every user read "3e-4" as one.
_FLOAT = re.compile(r"^[-+]?(?:\d[\d_]*)?(?:\.\d*)?[eE][-+]?\d+$|^[-+]?\d[\d_]*\.\d*$|^[-+]?\.\d+$")


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that also reads ``3e-4`` as a float."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass


def parse_bool(text: str, what: str) -> bool:
    """``true / yes / on / 1`` or ``false / no / off / 0`` (any case); else an error naming ``what``."""
    value = str(text).strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError(f"{what} is true or false (or yes / no, on / off, 1 / 0), got {text!r}")


def split_assignment(pair: str, flag: str, example: str, form: str = "KEY=VALUE") -> tuple[str, str]:
    """``"key=value"`` -> ``("key", "value")``, both stripped; an error names ``flag``, the ``form``
    it takes and an ``example``."""
    key, sep, value = pair.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"{flag} {pair!r} must look like {form} (e.g. {example})")
    return key.strip(), value.strip()


def parse_assignments(pairs: Iterable[str], flag: str, example: str, form: str = "KEY=VALUE",
                      read: Callable[[str], Any] = load_yaml) -> dict[str, Any]:
    """``KEY=VALUE`` strings -> ``{key: read(value)}`` (YAML values by default); a later key wins."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, value = split_assignment(pair, flag, example, form)
        out[key] = read(value)
    return out


def coerce(raw: str, like: Any, what: str, example: str | None = None) -> Any:
    """``raw`` typed like the default ``like``: bool (the words above), int (``1e3`` is 1000, ``2.5``
    is refused rather than cut), float, or str; an error names ``what``, the type it takes and
    ``example`` when given."""
    if isinstance(like, bool):
        return parse_bool(raw, what)
    try:
        if isinstance(like, int):
            number = float(raw)
            if not number.is_integer():
                raise ValueError(raw)
            return int(number)
        if isinstance(like, float):
            return float(raw)
    except ValueError:
        kind = "an integer" if isinstance(like, int) else "a number"
        raise ValueError(f"{what} takes {kind}, " + (f"e.g. {example}" if example else f"got {raw!r}")) from None
    return raw


__all__ = ["FALSE_WORDS", "TRUE_WORDS", "coerce", "load_yaml", "parse_assignments", "parse_bool",
           "split_assignment"]

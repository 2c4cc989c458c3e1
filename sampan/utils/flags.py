"""Command-line flags generated from a dataclass: each field written once, in the dataclass.

``add_dataclass_args(parser, Config)`` adds one ``--flag`` per field, typed by the field's
annotation, defaulted from the field and explained by the field's documentation (a ``Fields:``
section of the class docstring, or a string right under the field); ``dataclass_from_args``
builds the config back from the parsed namespace. How each annotation reads on the command line:

* ``bool``: ``--x`` / ``--no-x``, and ``--x true|false`` (also yes / no, on / off, 1 / 0);
* ``int``, ``float``, ``str``: the value, parsed by that type;
* ``X | None`` (``Optional[X]``): a value parsed as ``X``, or ``none`` for None;
* ``tuple[X, ...]`` / ``list[X]``: a comma-separated list (``--x a,b``; ``--x ""`` is empty);
  ``tuple[X, Y]`` takes exactly that many items;
* ``Literal["a", "b"]``: one of the choices.

Any other annotation (a ``dict``, a nested dataclass) is a ``TypeError`` unless the caller
excludes the field and gives it a flag of its own, so a new field never loses its flag silently.
Imports nothing from sampan (the planner's torch-free verb uses it too).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def parse_bool(text: str) -> bool:
    """``true`` / ``false`` (also yes / no, on / off, 1 / 0; any case) -> bool."""
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


parse_bool.__name__ = "boolean"  # argparse names the type in its error: "invalid boolean value: 'x'"


def field_docs(cls: type) -> dict[str, str]:
    """Each field's documentation, one line: the ``name: text`` entries of the class docstring's
    ``Fields:`` section (continuation lines joined), then for fields it does not cover a string
    literal right under the field (PEP 257's attribute docstrings)."""
    docs: dict[str, str] = {}
    lines = (cls.__doc__ or "").splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.strip() == "Fields:"), len(lines))
    name, indent = None, None
    for line in lines[start:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        head, sep, text = line.strip().partition(":")
        if sep and head.isidentifier() and (indent is None or depth == indent):
            name, indent = head, depth
            docs[name] = text.strip()
        elif name is not None and depth > indent:
            docs[name] += " " + line.strip()
        else:
            break
    for field, text in _attribute_docstrings(cls).items():
        docs.setdefault(field, text)
    return docs


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """``field: T = default`` followed by a string literal, in the class's source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # no source (a REPL class, a frozen build)
        return {}
    body = next((node.body for node in tree.body if isinstance(node, ast.ClassDef)), [])
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


@dataclasses.dataclass(frozen=True)
class _Kind:
    """How one annotation reads: ``parse`` turns the text into the value, ``show`` the default into text."""

    parse: Callable[[str], Any] | None  # None: a bool flag
    show: Callable[[Any], str]
    metavar: str | None = None
    choices: tuple | None = None


def _named(fn: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    fn.__name__ = name  # argparse's "invalid <name> value: 'x'"
    return fn


def _scalar(tp: Any) -> Callable[[str], Any] | None:
    if tp is bool:
        return parse_bool
    if tp in (int, float, str):
        return tp
    return None


def _kind(tp: Any, where: str) -> _Kind:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return _Kind(None, lambda v: "true" if v else "false")
    if tp in (int, float, str):
        return _Kind(tp, lambda v: repr(v) if v == "" else str(v))
    if origin is typing.Literal:
        return _Kind(_named(lambda s: type(args[0])(s), type(args[0]).__name__), str, choices=tuple(args))
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _kind(next(a for a in args if a is not type(None)), where)
        if inner.parse is None:
            parse = _named(lambda s: None if s.strip().lower() == "none" else parse_bool(s), "boolean")
        else:
            parse = _named(lambda s: None if s.strip().lower() == "none" else inner.parse(s),
                           getattr(inner.parse, "__name__", "value"))
        return _Kind(parse, lambda v: "none" if v is None else inner.show(v), inner.metavar, inner.choices)
    if origin in (tuple, list) or tp in (tuple, list):
        make = list if (origin or tp) is list else tuple
        fixed = None
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            fixed = args
        item_types = fixed or ((args[0],) if args else (str,))
        parsers = [_scalar(t) for t in item_types]
        if any(p is None for p in parsers):
            raise TypeError(f"{where}: no command-line form for the items of {tp!r}")

        def parse(text: str) -> Any:
            items = [t.strip() for t in text.split(",") if t.strip()]
            if fixed is not None and len(items) != len(fixed):
                raise argparse.ArgumentTypeError(f"expected {len(fixed)} comma-separated values, got {text!r}")
            return make(parsers[i if fixed else 0](item) for i, item in enumerate(items))

        return _Kind(_named(parse, "list"), lambda v: ",".join(map(str, v)) if v else "''",
                     metavar=",".join("ABCDEFGH"[:len(fixed)]) if fixed else "A,B,...")
    raise TypeError(f"{where}: no command-line form for {tp!r}; exclude the field and add its flag by hand")


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _metavar(names: Sequence[str]) -> str:
    """``--max-steps`` -> ``MAX_STEPS``: named after the flag (argparse's default is the dest's name)."""
    return names[0].lstrip("-").replace("-", "_").upper()


def add_dataclass_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *,
                       exclude: Iterable[str] = (), flags: Mapping[str, Sequence[str]] | None = None,
                       required: Iterable[str] = (), choices: Mapping[str, Sequence[Any]] | None = None,
                       metavars: Mapping[str, str] | None = None) -> list[str]:
    """Add one flag per field of dataclass ``cls`` (its ``dest`` is the field's name) and return
    the names of the fields that got one.

    ``flags`` renames a field's flag (``{"max_steps": ("--steps", "--max-steps")}``; default
    ``--field-name``), ``required`` makes a flag required (a field without a default always is),
    ``choices`` and ``metavars`` are argparse's, per field; ``exclude`` skips fields.
    """
    flags, choices, metavars = dict(flags or {}), dict(choices or {}), dict(metavars or {})
    exclude, required = set(exclude), set(required)
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = (exclude | required | set(flags) | set(choices) | set(metavars)) - known
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    added = []
    for field in dataclasses.fields(cls):
        if field.name in exclude or not field.init:
            continue
        kind = _kind(hints[field.name], f"{cls.__name__}.{field.name}")
        names = list(flags.get(field.name, ("--" + field.name.replace("_", "-"),)))
        default = _default(field)
        must = field.name in required or default is dataclasses.MISSING
        text = docs.get(field.name, "")
        if not must and "(default:" not in text:  # unless the documentation says it in its own words
            text = f"{text} (default: {kind.show(default)})".strip()
        text = text.replace("%", "%%")  # argparse formats help with %
        if kind.parse is None:  # bool: --x [BOOL] and --no-x
            parser.add_argument(*names, dest=field.name, nargs="?", const=True, type=parse_bool,
                                default=None if must else default, required=must, metavar="BOOL", help=text)
            negated = ["--no-" + n[2:] for n in names if n.startswith("--")]
            parser.add_argument(*negated, dest=field.name, action="store_false", default=argparse.SUPPRESS,
                                help=f"the same as {names[0]} false")
        else:
            allowed = choices.get(field.name, kind.choices)
            metavar = metavars.get(field.name, kind.metavar or (None if allowed else _metavar(names)))
            parser.add_argument(*names, dest=field.name, type=kind.parse, default=None if must else default,
                                required=must, choices=allowed, metavar=metavar, help=text)
        added.append(field.name)
    return added


def dataclass_from_args(cls: type, args: argparse.Namespace, **values: Any) -> Any:
    """``cls`` from the namespace's values of its fields (those ``add_dataclass_args`` added);
    ``values`` give the rest or override them."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    given = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return cls(**(given | values))

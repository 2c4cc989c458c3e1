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
import copy
import dataclasses
import inspect
import json
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
        names = [n.strip() for n in head.replace(",", "/").split("/")]  # "a / b: ..." or "a, b: ..." documents both
        if sep and all(n.isidentifier() for n in names) and (indent is None or depth == indent):
            name, indent = names, depth
            for n in names:
                docs[n] = text.strip()
        elif name is not None and depth > indent:
            for n in name:
                docs[n] += " " + line.strip()
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
    table: bool = False  # a dict: KEY=VALUE pairs merge into it, a JSON object replaces it
    many: bool = False  # a list of any length: repeated flags add to it


def _named(fn: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    fn.__name__ = name  # argparse's "invalid <name> value: 'x'"
    return fn


def _number(tp: type) -> Callable[[str], Any]:
    """``int`` / ``float`` from text as ``--set`` reads them too (``sampan.utils.settings.coerce``):
    ``1e3`` is the int 1000, ``2.5`` is refused for an int rather than cut."""
    from sampan.utils.settings import coerce

    return _named(lambda text: coerce(text, tp(0), tp.__name__), tp.__name__)


def _scalar(tp: Any) -> Callable[[str], Any] | None:
    if tp is bool:
        return parse_bool
    if tp in (int, float):
        return _number(tp)
    if tp is str:
        return str
    return None


def _kind(tp: Any, where: str) -> _Kind:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return _Kind(None, lambda v: "true" if v else "false")
    if tp in (int, float, str):
        return _Kind(_scalar(tp), lambda v: repr(v) if v == "" else str(v))
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
    if origin in (typing.Union, types.UnionType) and all(a in (int, float, str) for a in args):
        # int | str (a count or a word, as torchrun's --nproc_per_node): the first type that reads it
        def first(text: str) -> Any:
            for parse in sorted(args, key=(int, float, str).index):
                try:
                    return parse(text)
                except ValueError:
                    continue
            raise argparse.ArgumentTypeError(f"expected {' or '.join(a.__name__ for a in args)}, got {text!r}")

        return _Kind(_named(first, "value"), str)
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
                     metavar=",".join("ABCDEFGH"[:len(fixed)]) if fixed else "A,B,...", many=fixed is None)
    if origin is dict or tp is dict:
        return _Kind(_named(_parse_table, "KEY=VALUE"), lambda v: json.dumps(v, ensure_ascii=False) if v else "{}",
                     metavar="KEY=VALUE", table=True)
    raise TypeError(f"{where}: no command-line form for {tp!r}; exclude the field and add its flag by hand")


# ``dataclasses.field(default_factory=list, metadata={REPEAT: True})``: a list field whose flag is
# given once per item (``--set a=1 --set b=2``), each item whole (a comma is part of it).
REPEAT = "sampan.flags.repeat"
# ``metadata={SWITCH: True}`` on a bool field: its flag takes no value (``--json``, ``--list``), so
# a word after it is never read as the bool (``sampan report --json RUN_DIR``).
SWITCH = "sampan.flags.switch"


def _parse_table(text: str) -> dict[str, Any]:
    """A dict flag's value: a JSON object (``'{"dp_degree": 2}'``), or ``KEY=VALUE`` with a dotted
    KEY for nested tables (``hybrid_configs.dp_degree=2``) and the value read as YAML."""
    from sampan.utils.config import set_path
    from sampan.utils.settings import load_yaml

    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise argparse.ArgumentTypeError(f"not a JSON object: {err}") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError("expected a JSON object")
        return {"": value}  # the whole table (see _TableAction)
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE or a JSON object, got {text!r}")
    out: dict[str, Any] = {}
    try:
        set_path(out, key.strip(), load_yaml(raw.strip()) if raw.strip() else "", "KEY")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return out


def _first_time(namespace: argparse.Namespace, dest: str) -> bool:
    """Whether ``dest`` is given for the first time on this command line (then it replaces the
    default; later occurrences add to it)."""
    seen = namespace.__dict__.setdefault("_sampan_flags_seen", set())
    first = dest not in seen
    seen.add(dest)
    return first


class _ListAction(argparse.Action):
    """A list flag: ``--x a,b`` and ``--x a --x b`` both give ``(a, b)``; the first occurrence
    replaces the default."""

    def __call__(self, parser, namespace, values, option_string=None):
        current = getattr(namespace, self.dest, None)
        if _first_time(namespace, self.dest) or current is None:
            setattr(namespace, self.dest, values)
        else:
            setattr(namespace, self.dest, type(values)([*current, *values]))


class _TableAction(argparse.Action):
    """A dict flag: each ``KEY=VALUE`` merges into the value (the default's keys kept); a JSON
    object replaces it."""

    def __call__(self, parser, namespace, values, option_string=None):
        from sampan.utils.config import merge

        current = getattr(namespace, self.dest, None)
        if _first_time(namespace, self.dest) or not isinstance(current, dict):
            current = copy.deepcopy(current) if isinstance(current, dict) else {}
        if "" in values:
            setattr(namespace, self.dest, values[""])
        else:
            setattr(namespace, self.dest, merge(current, values))


class _FanoutAction(argparse.Action):
    """One flag that sets several fields to one value (``targets``)."""

    def __init__(self, *args: Any, targets: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.targets = targets

    def __call__(self, parser, namespace, values, option_string=None):
        for target in self.targets:
            setattr(namespace, target, values)


class _BoolAction(argparse.Action):
    """``--x`` (True), ``--x BOOL``; ``--no-x`` is a separate ``store_false``."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True if values is None else values)


def _flag_name(flag_path: str) -> str:
    """``max_steps`` -> ``--max-steps``; a nested ``training.max_steps`` keeps its dots and underscores
    (``--training.max_steps``, as torchtitan spells nested flags)."""
    if "." in flag_path:
        return "--" + flag_path
    return "--" + flag_path.replace("_", "-")


def _matches(path: str, keys: Iterable[str]) -> bool:
    """``path`` is one of ``keys`` or lies under one (``training`` covers ``training.max_steps``)."""
    return any(path == k or path.startswith(k + ".") for k in keys)


def add_dataclass_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *,
                       exclude: Iterable[str] = (), flags: Mapping[str, Sequence[str]] | None = None,
                       aliases: Mapping[str, Sequence[str]] | None = None, required: Iterable[str] = (),
                       choices: Mapping[str, Sequence[Any]] | None = None,
                       metavars: Mapping[str, str] | None = None, positional: Mapping[str, Any] | None = None,
                       consts: Mapping[str, tuple[str, Any, str]] | None = None,
                       fanout: Mapping[str, Sequence[str]] | None = None, overrides_only: bool = False) -> list[str]:
    """Add one flag per settable field of dataclass ``cls``'s tree (nested configs included, see
    ``sampan.utils.config``) and return the fields' dotted paths; each flag's ``dest`` is its path.

    Every mapping below is keyed by a field's dotted path (``"training.max_steps"``; a top-level
    field's path is its name). ``flags`` replaces a field's option strings (default
    ``--field-name``, ``--nested.field_name`` for a nested field, ``--field-name`` again for one
    of a flattened nesting); ``aliases`` adds more (``{"training.learning_rate": ("--lr",)}``);
    ``required`` makes flags required (a field without a default always is); ``choices`` and
    ``metavars`` are argparse's; ``positional`` makes fields positional arguments, the value
    being argparse's ``nargs`` (None: exactly one); ``fanout`` adds flags that set several fields of
    one type at once (the demo's ``--device`` sets every stage's); ``consts`` adds flags that store a
    constant into a field (``{"--resume": ("training.resume_from_checkpoint", "auto", "help")}``);
    ``exclude`` skips fields (a nested field's name skips its whole subtree). ``overrides_only``: no
    defaults at all, so only the flags given land in the namespace (``overrides_from_args``), for a
    verb whose file holds the rest. A field's metadata may ask for ``REPEAT`` (one item per flag)
    or ``SWITCH`` (a bool flag that takes no value).
    """
    from sampan.utils.config import leaves, owned_paths

    flags, aliases = dict(flags or {}), dict(aliases or {})
    choices, metavars, positional = dict(choices or {}), dict(metavars or {}), dict(positional or {})
    exclude, required = set(exclude), set(required)
    all_leaves = list(leaves(cls))
    paths = {leaf.path for leaf in all_leaves}
    prefixes = {p.rsplit(".", i)[0] for p in paths for i in range(p.count(".") + 1)}
    targets = {c[0] for c in (consts or {}).values()} | {p for ps in (fanout or {}).values() for p in ps}
    unknown = ((exclude | required | set(flags) | set(aliases) | set(choices) | set(metavars) | set(positional))
               - prefixes) | (targets - paths)
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    docs_of: dict[type, dict[str, str]] = {}
    groups: dict[str, Any] = {}
    added = []
    owned = owned_paths(cls)  # set by a parent config itself, or not used: no flag
    for leaf in all_leaves:
        path = leaf.path
        if _matches(path, exclude) or path in owned:
            continue
        docs = docs_of.setdefault(leaf.owner, field_docs(leaf.owner))
        kind = _kind(leaf.hint, f"{leaf.owner.__name__}.{leaf.field.name}")
        if leaf.field.metadata.get(REPEAT):  # each occurrence one whole item, commas included
            kind = _Kind(_named(lambda s: [s], "value"), lambda v: " ".join(map(str, v)) if v else "none",
                         metavar=None, many=True)
        group = parser
        if "." in leaf.flag_path:  # a nested, not flattened, config: its flags in a group of their own
            section = leaf.flag_path.rsplit(".", 1)[0]
            if section not in groups and isinstance(parser, argparse.ArgumentParser):
                groups[section] = parser.add_argument_group(f"--{section}.*: {leaf.owner.__name__}",
                                                            _section_doc(cls, section, leaf.owner))
            group = groups.get(section, parser)
        must = (path in required or leaf.default is dataclasses.MISSING) and not overrides_only
        text = docs.get(leaf.field.name, "")
        if not must and not overrides_only and "(default:" not in text:  # unless the docs say it in their own words
            text = f"{text} (default: {kind.show(leaf.default)})".strip()
        text = text.replace("%", "%%")  # argparse formats help with %
        value_default = argparse.SUPPRESS if overrides_only else (None if must else copy.deepcopy(leaf.default))
        allowed = choices.get(path, kind.choices)
        if path in positional:
            nargs = positional[path]
            # A list given as several words (nargs "*", "+", REMAINDER) takes each word whole.
            parse = None if kind.many and nargs not in (None, "?") else kind.parse
            group.add_argument(path, type=parse, nargs=nargs, choices=allowed, help=text,
                               metavar=metavars.get(path, leaf.field.name.upper()),
                               **({} if nargs is None else {"default": value_default}))
            added.append(path)
            _mark(group, path)
            continue
        names = list(flags.get(path, (_flag_name(leaf.flag_path),))) + list(aliases.get(path, ()))
        hidden = [n.replace("_", "-") for n in names if "." in n and "_" in n and n.replace("_", "-") not in names]
        if kind.parse is None and leaf.field.metadata.get(SWITCH):  # a bool flag that takes no value
            group.add_argument(*names, dest=path, action="store_true", default=value_default, help=text)
        elif kind.parse is None:  # bool: --x [BOOL]; --no-x for the undotted spellings
            group.add_argument(*names, dest=path, nargs="?", type=parse_bool, action=_BoolAction,
                               default=value_default, required=must, metavar="BOOL", help=text)
            negated = ["--no-" + n[2:] for n in names if n.startswith("--") and "." not in n]
            if negated:
                group.add_argument(*negated, dest=path, action="store_false", default=argparse.SUPPRESS,
                                   help=f"the same as {names[0]} false")
        else:
            metavar = metavars.get(path, kind.metavar or (None if allowed else _metavar(names)))
            action = _TableAction if kind.table else (_ListAction if kind.many else "store")
            group.add_argument(*names, dest=path, type=kind.parse, default=value_default, required=must,
                               choices=allowed, metavar=metavar, help=text, action=action)
        if hidden:  # --training.max-steps works too, without a second line in --help
            group.add_argument(*hidden, dest=path, type=kind.parse or parse_bool, help=argparse.SUPPRESS,
                               default=argparse.SUPPRESS, **({"nargs": "?", "const": True}
                                                             if kind.parse is None else {}))
        _mark(group, path)
        added.append(path)
    for flag, (target, value, text) in (consts or {}).items():
        parser.add_argument(flag, dest=target, action="store_const", const=value, default=argparse.SUPPRESS,
                            help=text.replace("%", "%%"))
        _mark(parser, target)
    by_path = {leaf.path: leaf for leaf in all_leaves}
    for flag, fields in (fanout or {}).items():
        first = by_path[fields[0]]
        kind = _kind(first.hint, flag)
        docs = field_docs(first.owner).get(first.field.name, "")
        parser.add_argument(flag, dest=fields[0], type=kind.parse or parse_bool, action=_FanoutAction,
                            targets=tuple(fields), default=argparse.SUPPRESS, metavar=_metavar([flag]),
                            help=f"{docs} Sets {', '.join(fields)}.".replace("%", "%%"))
        _mark(parser, fields[0])
    # The configs a verb's flags come from (tests/test_config_tree.py walks them).
    parser.__dict__.setdefault("sampan_configs", []).append(cls)
    return added


def _section_doc(cls: type, section: str, owner: type) -> str | None:
    """What a nested config's flag group is for: the parent's documentation of the field that
    nests it (``DemoConfig.ernie``), else the first line of the nested class's docstring."""
    from sampan.utils.config import nesting

    parent = cls
    *steps, last = section.split(".")
    for step in steps:  # down the tree, through flattened nestings too
        field = next((f for f in dataclasses.fields(parent) if f.name == step), None)
        if field is None or nesting(field) is None:
            break
        parent = nesting(field).cls
    text = field_docs(parent).get(last)
    if not text and owner.__doc__:
        text = owner.__doc__.strip().splitlines()[0]
    return (text or "").replace("%", "%%") or None


def _mark(parser: Any, path: str) -> None:
    """Tag the actions just added with the field they set (``tests/test_config_tree.py`` checks that
    every verb's flags come from its config)."""
    for action in parser._actions[::-1]:
        if getattr(action, "sampan_path", None) is not None:
            break
        if action.dest == path:
            action.sampan_path = path


def _metavar(names: Sequence[str]) -> str:
    """``--max-steps`` -> ``MAX_STEPS``, ``--training.max_steps`` -> ``MAX_STEPS``: named after the
    flag's last part (argparse's default is the whole dest's name)."""
    return names[0].lstrip("-").rsplit(".", 1)[-1].replace("-", "_").upper()


def _tree(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The namespace's values of ``cls``'s fields as nested dicts (only the fields it holds)."""
    from sampan.utils.config import leaves, set_path

    tree: dict[str, Any] = {}
    for leaf in leaves(cls):
        if hasattr(args, leaf.path):
            set_path(tree, leaf.path, getattr(args, leaf.path))
    return tree


def dataclass_from_args(cls: type, args: argparse.Namespace, **values: Any) -> Any:
    """``cls`` from the namespace's values of its tree's fields (those ``add_dataclass_args``
    added); ``values`` give the rest or override them (dotted keys reach nested fields)."""
    from sampan.utils.config import build, set_path

    tree = _tree(cls, args)
    for key, value in values.items():
        set_path(tree, key, value)
    return build(cls, tree)


def overrides_from_args(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """``{dotted path: value}`` of the flags given (with ``add_dataclass_args(..., overrides_only=True)``)."""
    from sampan.utils.config import leaves

    return {leaf.path: getattr(args, leaf.path) for leaf in leaves(cls) if hasattr(args, leaf.path)}


def _typed(hint: Any, raw: str, what: str, example: str | None = None) -> Any:
    """``raw`` read as a field of type ``hint`` would be from a flag; numbers and booleans through
    ``sampan.utils.settings`` so ``1e3`` is an int and ``2.5`` is refused for one, with a message
    naming ``what``."""
    from sampan.utils.settings import coerce, parse_bool

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args and len(args) == 2:
        if raw.strip().lower() in ("none", "null", ""):
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        return parse_bool(raw, what)
    if hint in (int, float):
        return coerce(raw, hint(0), what, example)
    kind = _kind(hint, what)
    try:
        return kind.parse(raw)
    except (argparse.ArgumentTypeError, ValueError) as err:
        raise ValueError(f"{what}: {err}") from None


def typed_assignments(cls: type, pairs: Iterable[str], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` strings for ``cls``'s tree (``--set training.max_steps=100``) as nested dicts, each
    value typed by its field (a KEY inside a dict field, ``model.overrides.num_layers=2``, is read as
    YAML). Errors name the pair: an unknown key (with a close match, or the key it became: the
    class's ``RENAMED``), a key the config does not let be set (``OWNED``), a value of the wrong type."""
    from sampan.utils.config import leaves, owned_paths, set_path
    from sampan.utils.names import did_you_mean
    from sampan.utils.settings import load_yaml, split_assignment

    by_path = {leaf.path: leaf for leaf in leaves(cls)}
    owned = owned_paths(cls)
    tree: dict[str, Any] = {}
    for pair in pairs:
        key, raw = split_assignment(pair, flag, f"{next(iter(by_path))}=...")
        what = f"{flag} {pair!r}: {key}"
        if key in owned:
            raise ValueError(f"{flag} {pair!r}: {key} is {owned[key]}; leave it out")
        leaf = by_path.get(key)
        if leaf is not None:
            value = _typed(leaf.hint, raw, what, f"{key}={leaf.default}")
        else:
            table = next((p for p, lf in by_path.items() if key.startswith(p + ".") and _kind(lf.hint, p).table),
                         None)
            if table is None:
                renamed = getattr(cls, "RENAMED", {})
                if key in renamed:
                    raise ValueError(f"{flag} {pair!r}: {key} is now {renamed[key]} ({flag} {renamed[key]}={raw})")
                keys = sorted({p.split(".")[0] + (".*" if "." in p else "") for p in set(by_path) - set(owned)})
                raise ValueError(f"{flag} {pair!r}: {did_you_mean(key, set(by_path) - set(owned))}expected KEY=VALUE "
                                 f"with KEY a field of {cls.__name__}: {', '.join(keys)}")
            value = load_yaml(raw) if raw else ""
        set_path(tree, key, value, flag)
    return tree


@dataclasses.dataclass
class Changes:
    """Changes to a run file's or a recipe's values, the ``--set`` flag every such verb takes.

    Fields:
        set: change one value, KEY=VALUE with KEY its dotted path (e.g. training.max_steps=50,
            strategy.hybrid_configs.dp_degree=2); repeatable; the value is read as its field's type
            (as YAML inside a table).
    """

    set: list[str] = dataclasses.field(default_factory=list, metadata={REPEAT: True})

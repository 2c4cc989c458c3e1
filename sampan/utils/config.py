"""One configuration tree: config dataclasses that nest each other instead of restating fields.

Each setting is declared once, in the dataclass that owns it (``TrainingArguments.learning_rate``,
``DataBuildConfig.seq_len``, ...). A bigger config nests the owner with :func:`nested`, giving the
values it wants by default, as torchtitan's ``JobConfig`` nests its sections::

    @dataclasses.dataclass
    class PretrainConfig:
        masking: str = "knowledge"
        training: TrainingArguments = nested(TrainingArguments, learning_rate=5e-4, max_steps=300)

        def __post_init__(self):
            resolve_nested(self)

``PretrainConfig(training={"max_steps": 12})`` merges the mapping over the nested defaults (so the
run keeps ``learning_rate=5e-4``); a ``TrainingArguments`` instance is taken as it is. The
command line mirrors the tree (``--training.max_steps``, ``sampan.utils.flags``), and so do run
files and ``--set training.max_steps=12``.

:func:`build` turns a mapping (a run file, ``--set`` pairs) into a config: an unknown key is an
error that names it, suggests a close match, and says where a key that moved now lives (a class's
``RENAMED`` mapping, e.g. ``{"steps": "training.max_steps"}``). Imports nothing from sampan
but ``utils``.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from sampan.utils.names import did_you_mean

_KEY = "sampan.nested"


@dataclasses.dataclass(frozen=True)
class Nesting:
    """How a field nests a config: its class, the defaults the parent gives it, and whether its flags
    are flattened into the parent's (``--seq-len`` rather than ``--workload.seq_len``)."""

    cls: type
    defaults: Mapping[str, Any]
    flatten: bool = False


def nested(cls: type, /, *, flatten: bool = False, **defaults: Any) -> Any:
    """A dataclass field holding a ``cls`` config, by default ``cls`` built from ``defaults`` (its
    own defaults for the rest). Call :func:`resolve_nested` in the parent's ``__post_init__`` so a
    mapping given for the field is merged over ``defaults``."""
    frozen = copy.deepcopy(defaults)
    return dataclasses.field(default_factory=lambda: _nested_value(Nesting(cls, {}), copy.deepcopy(frozen), ""),
                             metadata={_KEY: Nesting(cls, frozen, flatten)})


def nesting(field: dataclasses.Field) -> Nesting | None:
    """The :class:`Nesting` of a field made by :func:`nested`, else None."""
    return field.metadata.get(_KEY)


def _nested_value(nest: Nesting, value: Any, where: str) -> Any:
    """A nested field's value as its config: a mapping is merged over the field's defaults; a class
    with an ``of`` classmethod (``ModelChoice.of``) reads other forms too (a bare name)."""
    if isinstance(value, nest.cls):
        return value
    coerce = getattr(nest.cls, "of", None)
    if isinstance(value, Mapping):
        value = merge(nest.defaults, value)
        return coerce(value) if coerce is not None else build(nest.cls, value, where)
    if coerce is not None:
        return coerce(value)
    raise ValueError(f"{where.rstrip('.')} must be a {nest.cls.__name__} or a mapping of its fields, got {value!r}")


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base`` key by key; mappings on both sides merge recursively."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _unknown_key(cls: type, key: str, where: str) -> ValueError:
    renamed = getattr(cls, "RENAMED", {})
    if key in renamed:
        return ValueError(f"key {where}{key} is now {where}{renamed[key]}: rename it")
    allowed = sorted(_fields(cls))
    section = f"{where.rstrip('.')} ({cls.__name__})" if where else cls.__name__
    return ValueError(f"unknown key {key!r} in {section}; {did_you_mean(key, allowed)}allowed: {allowed}")


def build(cls: type, data: Mapping[str, Any], where: str = "") -> Any:
    """``cls`` from a mapping, nested configs included; ``where`` prefixes key names in errors
    (``training.``). Unknown keys are errors naming the key (see the module docstring)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where.rstrip('.') or cls.__name__} must be a table / mapping of "
                         f"{cls.__name__} fields, got {data!r}")
    fields = _fields(cls)
    for key in data:
        if key not in fields:
            raise _unknown_key(cls, str(key), where)
    values = {}
    for key, value in data.items():
        nest = nesting(fields[key])
        values[key] = value if nest is None else _nested_value(nest, value, f"{where}{key}.")
    try:
        return cls(**values)
    except TypeError as err:  # a required field missing
        raise ValueError(f"{where.rstrip('.') or cls.__name__}: {err}") from None


def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s field types, or none where they cannot be resolved (a class local to a function)."""
    try:
        return typing.get_type_hints(cls)
    except NameError:
        return {}


def resolve_nested(obj: Any) -> None:
    """In a config's ``__post_init__``: every nested field given as a mapping becomes its config,
    built over the field's defaults (one of another type is an error naming the field), and a list
    given for a tuple field becomes a tuple (as a run file or a card stores it)."""
    for field in dataclasses.fields(obj):
        nest = nesting(field)
        value = getattr(obj, field.name)
        if nest is not None:
            setattr(obj, field.name, _nested_value(nest, value, f"{field.name}."))
        elif isinstance(value, list) and typing.get_origin(_hints(type(obj)).get(field.name)) is tuple:
            setattr(obj, field.name, tuple(value))


def to_dict(obj: Any) -> dict[str, Any]:
    """A config as plain nested dicts, tuples as lists (for JSON, TOML and model cards)."""
    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(obj))


def set_path(data: dict[str, Any], dotted: str, value: Any, what: str = "key") -> None:
    """``data["a"]["b"]["c"] = value`` for ``dotted`` "a.b.c", creating the tables on the way; an
    error when a step is a value rather than a table."""
    *tables, key = dotted.split(".")
    if not key or not all(tables):
        raise ValueError(f"{what} {dotted!r} is not a dotted name like training.max_steps")
    node = data
    for i, table in enumerate(tables):
        node = node.setdefault(table, {})
        if not isinstance(node, dict):
            raise ValueError(f"{what} {dotted!r}: {'.'.join(tables[:i + 1])} is a value, not a table")
    node[key] = value


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any], what: str = "key") -> dict[str, Any]:
    """A deep copy of ``data`` with each dotted key of ``overrides`` set (``--set`` pairs)."""
    out = copy.deepcopy(dict(data))
    for dotted, value in overrides.items():
        set_path(out, dotted, value, what)
    return out


def get_path(obj: Any, dotted: str) -> Any:
    """The value at ``dotted`` (``training.max_steps``) of a config."""
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, Mapping) else getattr(obj, part)
    return obj


def default_at(cls: type, dotted: str) -> Any:
    """The default value of the field at ``dotted`` in ``cls``'s tree: what the nestings on the way
    give it, else the owning class's own default."""
    head, _, rest = dotted.partition(".")
    field = _fields(cls)[head]
    if not rest:
        if field.default is not dataclasses.MISSING:
            return field.default
        return field.default_factory() if field.default_factory is not dataclasses.MISSING else dataclasses.MISSING
    nest = nesting(field)
    if nest is None:
        raise KeyError(f"{cls.__name__}.{head} nests no config, so it has no {rest}")
    node: Any = nest.defaults
    for part in rest.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default_at(nest.cls, rest)
        node = node[part]
    return node


def refuse_changes(obj: Any) -> None:
    """Fields of nested configs a user may not set here (the class's ``OWNED``, dotted path -> why,
    e.g. "set by the demo (<stage dir>/data)" or "not used by a fine-tune (...)"): each must still
    hold its default, or an error names it and why."""
    for dotted, why in type(obj).OWNED.items():
        if get_path(obj, dotted) != default_at(type(obj), dotted):
            raise ValueError(f"{type(obj).__name__}.{dotted} is {why}; leave it unset")


def owned_paths(cls: type, prefix: str = "") -> dict[str, str]:
    """The dotted paths in ``cls``'s tree a user may not set (``OWNED``, see :func:`refuse_changes`),
    each with why: no flag is made for them."""
    out = {prefix + path: why for path, why in getattr(cls, "OWNED", {}).items()}
    for field in dataclasses.fields(cls):
        nest = nesting(field)
        if nest is not None:
            out |= owned_paths(nest.cls, f"{prefix}{field.name}.")
    return out


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One settable field of a config tree: ``path`` is its dotted place (``training.max_steps``),
    ``flag_path`` the same without the flattened nestings' names, ``owner`` the dataclass that
    declares it, ``hint`` its type and ``default`` the tree's default value for it."""

    path: str
    flag_path: str
    field: dataclasses.Field
    owner: type
    hint: Any
    default: Any


def leaves(cls: type, default: Any = None, path: str = "", flag_path: str = "") -> Iterator[Leaf]:
    """Every settable field of ``cls``'s tree, nested configs walked, with the tree's defaults
    (``default``: an instance of ``cls`` to read them from; None reads the class's own)."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        nest = nesting(field)
        if default is not None:
            value = getattr(default, field.name)
        elif field.default is not dataclasses.MISSING:
            value = field.default
        elif field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        else:
            value = dataclasses.MISSING
        if nest is not None:
            sub = f"{flag_path}{field.name}." if not nest.flatten else flag_path
            yield from leaves(nest.cls, value, f"{path}{field.name}.", sub)
        else:
            yield Leaf(f"{path}{field.name}", f"{flag_path}{field.name}", field, cls, hints[field.name], value)


def config_classes(cls: type) -> list[type]:
    """``cls`` and every config it nests, at any depth, each once, parents first."""
    out: list[type] = []

    def walk(c: type) -> None:
        if c in out:
            return
        out.append(c)
        for field in dataclasses.fields(c):
            nest = nesting(field)
            if nest is not None:
                walk(nest.cls)

    walk(cls)
    return out


__all__ = ["Leaf", "Nesting", "apply_overrides", "build", "config_classes", "default_at", "get_path", "leaves",
           "merge", "nested", "nesting", "owned_paths", "refuse_changes", "resolve_nested", "set_path", "to_dict"]

"""The one reader of configuration files: TOML (``.toml``), YAML (``.yaml`` / ``.yml``) and JSON.

Run files (``sampan train --config``), ``sampan simulate --strategy FILE``, the planner's model
files and tests read through :func:`load_config_file`, so every verb accepts the same formats and
reports a bad file the same way. Imports nothing from sampan but ``utils``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SUFFIXES = (".toml", ".yaml", ".yml", ".json")


def _toml_loads(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the tomli backport (a dependency there, see pyproject.toml)
        import tomli as tomllib
    return tomllib.loads(text)


def parse_config_text(text: str, suffix: str, where: str = "config") -> Any:
    """``text`` in the format its ``suffix`` names (``.toml``, ``.yaml`` / ``.yml``, ``.json``); a
    syntax error is a ``ValueError`` naming ``where`` and the reason."""
    suffix = suffix.lower()
    try:
        if suffix == ".toml":
            return _toml_loads(text)
        if suffix in (".yaml", ".yml"):
            from sampan.utils.settings import load_yaml

            return load_yaml(text)
        if suffix == ".json":
            return json.loads(text)
    except ValueError as err:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        raise ValueError(f"{where} is not valid {suffix.lstrip('.').upper()}: {err}") from None
    except Exception as err:  # yaml.YAMLError
        if type(err).__module__.startswith("yaml"):
            raise ValueError(f"{where} is not valid YAML: {err}") from None
        raise
    raise ValueError(f"{where} must end in one of {', '.join(SUFFIXES)}")


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML, YAML or JSON file into a dict (an empty file is ``{}``).

    Errors name the file: it is missing, its suffix is none of ``.toml`` / ``.yaml`` / ``.yml`` /
    ``.json``, it does not parse, or its top level is not a table / mapping.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} not found")
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(f"config file {path} must end in .toml, .yaml, .yml or .json")
    data = parse_config_text(path.read_text(encoding="utf-8"), path.suffix, f"config file {path}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a table / mapping at the top level")
    return data

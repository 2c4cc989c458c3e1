"""Turn an error from torch (dynamo, torch.export, the ONNX exporter, a ``cond`` / ``while_loop``)
into a :class:`Dy2StaticError` that names the user's ``file:line``, the construct and the fix.

Converted code keeps the user's file name and line numbers, so the innermost frame outside torch
and ``sampan.jit`` in the error's tracebacks (or in the user stack dynamo records) is the user's
line. The construct and the fix come from what torch says, matched against the failure classes
below; torch's own first line is quoted after ours and the torch error is chained as the cause.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import traceback
from collections.abc import Callable, Iterator

from sampan.jit.errors import Dy2StaticError
from sampan.jit.library import is_library_file

# (pattern in torch's message, the construct, what to change). First match wins.
_CLASSES: tuple[tuple[str, str, str], ...] = (
    (r"Expected (then|true|else|false)\w* and (then|true|else|false)\w* to have same metadata|"
     r"branches? .*(same metadata|different (shape|dtype))|merging two branches' output",
     "the branches of a tensor 'if' (or the returns that follow it) give values of different shapes "
     "or dtypes",
     "make every branch and every 'return' give tensors of one shape and dtype (cast, pad or "
     "broadcast them before)"),
    (r"body_fn.*(shape|dtype|metadata)|carried.*(shape|dtype|metadata)|(shape|dtype|metadata).*carried",
     "a variable whose shape or dtype changes from one iteration of a tensor loop to the next",
     "preallocate it at full size (and cast it) before the loop"),
    (r"Dynamic shape operator|dynamic output shape|data.dependent output|aten\.nonzero|"
     r"masked_select|aten\.unique|boolean mask",
     "an op whose result's shape depends on tensor values (boolean-mask indexing x[mask], nonzero, "
     "unique, masked_select)",
     "keep the shape fixed: torch.where(mask, x, 0) instead of x[mask], or a mask multiplied in"),
    (r"input-to-input aliasing",
     "two tensors that a tensor 'if' or loop reads from outside share memory (one is a view of the other, "
     "as y = x[0] is of x)",
     "read one of them as a copy (y = x[0].clone() before the 'if' or loop)"),
    (r"mutat|in-place|inplace|aliasing|alias(es|ed)? (an )?input",
     "an in-place update of a tensor (x.add_(...), x[i] = v, x += y on an attribute) inside tensor "
     "control flow",
     "write it out of place (y = x + 1; x = torch.where(...)) so each branch or iteration makes a "
     "new tensor"),
    (r"data-dependent|data dependent|GuardOnDataDependentSymNode|specialized integer|unbacked|"
     r"Could not guard|item\(\)|tolist",
     "a Python number or bool taken from a tensor's value (int() / float() / bool() / .item() / "
     ".tolist() outside a condition, used where Python must decide with it, such as range(int(t)))",
     "keep the value a tensor: loop with for i in range(t) over the tensor itself, index with x[i] or "
     "torch.index_select / torch.gather, and compare tensors in the condition itself (if t.sum() > 0:)"),
    (r"Unsupported|graph break|Graph break|not supported|unsupported",
     "a call torch.compile cannot trace into one graph",
     "use tensor operations here, mark the called function @sampan.jit.not_to_static so it runs as "
     "it is, or pass full_graph=False to allow graph breaks"),
)
# Classes reported at the line of the converted `if` / `while` rather than inside its body.
_AT_CONSTRUCT = (_CLASSES[0][1], _CLASSES[1][1])
_DEFAULT = ("a construct torch cannot capture in one graph",
            "rewrite this line with tensor operations (docs/jit.md lists what converts), or pass "
            "full_graph=False to allow graph breaks")


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):  # no file to name (<string>, <frozen ...>)
        return False
    return not is_library_file(filename)


_FRAME_TEXT = re.compile(r'File "([^"]+)", line (\d+)|#\s*(\S+?\.py):(\d+) in ')


def user_location(error: BaseException) -> tuple[str, int] | None:
    """The innermost ``(file, line)`` of user code behind ``error`` (None if there is none)."""
    found: tuple[str, int] | None = None
    for exc in _chain(error):
        frames = [(f.filename, f.lineno) for f in traceback.extract_tb(exc.__traceback__)]
        frames += [(f.filename, f.lineno) for f in getattr(exc, "real_stack", None) or []]
        user = [f for f in frames if _is_user_file(f[0]) and f[1]]
        if user:
            found = user[-1]
        # dynamo and torch.export write the user's stack into the message.
        for match in _FRAME_TEXT.finditer(str(exc)):
            name, line = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
            if _is_user_file(name) and os.path.exists(name):
                found = (name, int(line))
        if found is not None:
            return found
    return found


_OWN = re.compile(r'raised exception Dy2StaticError\((["\'])(.*?)\1\)', re.S)


def own_error(error: BaseException) -> Dy2StaticError | None:
    """The :class:`Dy2StaticError` a converter raised while torch traced it, which torch reports
    wrapped in its own exception (dynamo: "raised exception Dy2StaticError('...')"), or None."""
    for exc in _chain(error):
        if isinstance(exc, Dy2StaticError):
            return exc
        found = _OWN.search(str(exc))
        if found:
            own = Dy2StaticError(found.group(2).replace("\\'", "'").replace('\\"', '"'))
            own.__cause__ = error
            return own
    return None


def torch_reason(error: BaseException) -> str:
    """The first line of what torch said (innermost error in the chain), shortened."""
    for exc in reversed(list(_chain(error))):
        text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        if text:
            return text if len(text) <= 240 else text[:237] + "..."
    return type(error).__name__


def classify(error: BaseException) -> tuple[str, str]:
    """(construct, fix) for an error from torch, from the failure classes above."""
    text = "\n".join(f"{type(e).__name__}: {e}" for e in _chain(error))
    for pattern, construct, fix in _CLASSES:
        if re.search(pattern, text, re.IGNORECASE):
            return construct, fix
    return _DEFAULT


def to_dy2static(error: BaseException, action: str, where: str | None = None,
                 cls: type[Dy2StaticError] = Dy2StaticError) -> Dy2StaticError:
    """A :class:`Dy2StaticError` for ``error``: "FILE:LINE: `SOURCE`: ACTION: CONSTRUCT. Fix: FIX.
    (torch: REASON)". ``where`` is the location to use when no user frame is found."""
    if isinstance(error, Dy2StaticError):
        return error
    construct, fix = classify(error)
    # A mismatch between branches or iterations is about the `if` / `while` itself: name its line.
    location = None if (where and construct in _AT_CONSTRUCT) else user_location(error)
    source = ""
    if location is None and where and ":" in where:
        path, _, line = where.rpartition(":")
        location = (path, int(line)) if line.isdigit() else None
    if location is not None:
        where = f"{location[0]}:{location[1]}"
        source = linecache.getline(location[0], location[1]).strip()
    at = f" `{source}`:" if source else ""
    return cls(f"{where or '<unknown location>'}:{at} {action}: {construct}. Fix: {fix}. "
               f"(torch: {torch_reason(error)})")


@contextlib.contextmanager
def dy2static_errors(action: str, where: str | None = None, cls: type[Dy2StaticError] = Dy2StaticError,
                     explain: Callable[[], BaseException | None] | None = None) -> Iterator[None]:
    """Inside it, an exception leaves as the error the user should see (the one rule for every
    place that runs converted code: a ``cond`` / ``while_loop``, the compiled call, ``jit.save``):

    1. a :class:`Dy2StaticError` leaves as itself;
    2. a converter's own Dy2StaticError that torch wrapped in its own error leaves as itself
       (:func:`own_error`; torch's error is its cause when only its text was found);
    3. ``explain()``, when given, may name what to raise instead (``StaticFunction``: the user's
       own error, or the converted function's eager one), with torch's error as its cause;
    4. anything else leaves as ``to_dy2static(error, action, where, cls)``, torch's error its cause.
    """
    try:
        yield
    except Dy2StaticError:
        raise
    except Exception as error:  # noqa: BLE001 - re-raised as a Dy2StaticError with the error chained
        own = own_error(error)
        if own is not None:
            raise own from own.__cause__
        explained = explain() if explain is not None else None
        if explained is not None:
            raise explained from error
        raise to_dy2static(error, action, where, cls) from error

"""Turn a Python function into its converted twin: source -> AST -> passes -> code object.

The converted code keeps the user's file name and line numbers (every generated node takes the
location of the statement it replaces), so tracebacks, ``torch.compile`` messages and our own
errors point at the user's code. The function is rebuilt with the original globals and the
original closure cells (a change to a captured variable is seen, as in Python); generated free
variables (``_jst`` and converted callees) get cells of their own.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import os
import sys
import textwrap
import types
import weakref
from collections.abc import Iterator
from typing import Any

from torch import nn

import sampan.jit.runtime as runtime
from sampan.jit.library import is_library_callable, is_library_file
from sampan.jit.passes import NORMALISING, PASSES, ConversionError, PassContext
from sampan.jit.passes.base import JST


@dataclasses.dataclass
class ConvertedFunction:
    """The result of converting one function.

    Fields:
        function: the converted function (same signature as the original).
        code: the final transformed source.
        changed: whether any pass rewrote the function (if not, callers keep the original).
    """

    function: types.FunctionType
    code: str
    changed: bool


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_IN_PROGRESS: set[types.CodeType] = set()


def debug_enabled() -> bool:
    return os.environ.get("SAMPAN_JIT_DEBUG", "") not in ("", "0")


def _target(fn: types.FunctionType) -> types.FunctionType:
    """The function to convert for ``fn``: itself, or the user function inside a library
    decorator's wrapper (``@torch.no_grad()``), whose decorators the conversion re-applies."""
    # functools.wraps copies __module__ from the wrapped function, so a library decorator's
    # wrapper is told by where its code is.
    if hasattr(fn, "__wrapped__") and is_library_file(fn.__code__.co_filename):
        inner = inspect.unwrap(fn)
        if isinstance(inner, types.FunctionType):
            return inner
    return fn


def is_user_function(fn: Any) -> bool:
    """A plain Python function outside the library packages (so worth converting), or a library
    decorator's wrapper around one."""
    if not isinstance(fn, types.FunctionType) or hasattr(fn, "_jst_not_to_static"):
        return False
    target = _target(fn)
    return not hasattr(target, "_jst_not_to_static") and not is_library_callable(target)


def convert_function(fn: types.FunctionType, self_type: type | None = None) -> ConvertedFunction:
    """Convert ``fn`` (cached per function). ``self_type`` is the class when ``fn`` is a method,
    so calls such as ``self.helper(x)`` can be resolved and converted too."""
    cached = _CACHE.get(fn)
    if cached is not None:
        return cached
    target = _target(fn)
    _IN_PROGRESS.add(target.__code__)
    try:
        converted = _convert(target, self_type)
    finally:
        _IN_PROGRESS.discard(target.__code__)
    _CACHE[fn] = converted
    return converted


# Layers whose forward convert_layer replaced, so that a diagnosis can run the original code.
_CONVERTED_LAYERS: weakref.WeakSet = weakref.WeakSet()


def convert_layer(layer: nn.Module) -> None:
    """Convert, in place, the ``forward`` of ``layer`` and of every sub-layer that has Python
    control flow (its instance gets the converted ``forward``; hooks still run)."""
    for module in layer.modules():
        forward = getattr(type(module), "forward", None)
        if "forward" in module.__dict__ or not is_user_function(forward):
            continue
        converted = convert_function(forward, type(module))
        if converted.changed:
            module.forward = types.MethodType(converted.function, module)
            _CONVERTED_LAYERS.add(module)


@contextlib.contextmanager
def original_forwards() -> Iterator[None]:
    """While active, every layer converted in place runs its original ``forward``: the reference
    run that tells a user's own error from a conversion's."""
    saved = {m: m.__dict__.pop("forward") for m in set(_CONVERTED_LAYERS) if "forward" in m.__dict__}
    try:
        yield
    finally:
        for module, forward in saved.items():
            module.forward = forward


def _source_tree(fn: types.FunctionType) -> tuple[ast.Module, str]:
    filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
    try:
        # The code object, not the function: inspect follows a function's __wrapped__ to another one.
        lines, start = inspect.getsourcelines(fn.__code__)
    except (OSError, TypeError) as e:
        raise ConversionError(f"{filename}: cannot convert '{fn.__qualname__}': its source is not available "
                              f"({e}). Define it in a .py file.") from None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise ConversionError(f"{filename}:{start}: cannot convert '{fn.__qualname__}': only 'def' functions "
                              "convert (not lambdas or async functions). Rewrite it as a 'def'.")
    ast.increment_lineno(tree, start - 1)
    return tree, filename


def _convert(fn: types.FunctionType, self_type: type | None) -> ConvertedFunction:
    tree, filename = _source_tree(fn)
    ctx = PassContext(filename=filename, func_name=fn.__qualname__,
                      resolve_call=_Resolver(fn, tree.body[0], self_type))
    original = ast.dump(tree)
    for name, apply in PASSES:
        tree = apply(tree, ctx)
        if name in NORMALISING:  # what "unchanged" compares against
            original = ast.dump(tree)
        if debug_enabled():
            print(f"# --- sampan.jit: {fn.__qualname__} after pass '{name}' ---\n{ast.unparse(tree)}\n",
                  file=sys.stderr)
    ast.fix_missing_locations(tree)
    changed = ast.dump(tree) != original
    code = ast.unparse(tree)
    if not changed:
        return ConvertedFunction(fn, code, False)
    function = _build(fn, tree, filename, ctx.bindings)
    return ConvertedFunction(_decorate(function, fn, ctx.decorators, filename), code, True)


def _decorate(function: types.FunctionType, fn: types.FunctionType, decorators: list[ast.expr],
              filename: str) -> Any:
    """Apply the user's decorators (all but ``to_static``, which the ``decorators`` pass removed)
    to the converted function, innermost first, evaluated where ``fn`` was defined."""
    if not decorators:
        return function
    scope = dict(fn.__globals__)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
        with contextlib.suppress(ValueError):  # an empty cell
            scope[name] = cell.cell_contents
    for node in reversed(decorators):
        try:
            decorator = eval(compile(ast.Expression(body=node), filename, "eval"), scope)  # noqa: S307
            function = decorator(function)
        except Exception as e:  # noqa: BLE001 - reported as a ConversionError naming the decorator
            raise ConversionError(
                f"{filename}:{node.lineno}: cannot convert '{fn.__qualname__}': its decorator "
                f"'{ast.unparse(node)}' cannot be re-applied to the converted function ({type(e).__name__}: "
                f"{e}). Define the decorator at module level, or mark the function "
                "@sampan.jit.not_to_static.") from None
    return function


def _build(fn: types.FunctionType, tree: ast.Module, filename: str, bindings: dict[str, Any]) -> types.FunctionType:
    """Compile the converted definition inside a factory whose parameters are the free variables,
    then rebuild the function around the original closure cells."""
    funcdef = tree.body[0]
    free = [*fn.__code__.co_freevars, *bindings, JST]
    factory = ast.FunctionDef(
        name="_jst_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=n) for n in free], kwonlyargs=[], kw_defaults=[],
                           defaults=[]),
        body=[funcdef, ast.Return(value=ast.Name(id=funcdef.name, ctx=ast.Load()))],
        decorator_list=[], returns=None,
        **({"type_params": []} if "type_params" in ast.FunctionDef._fields else {}),
    )
    ast.copy_location(factory, funcdef)
    module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
    factory_code = compile(module, filename, "exec").co_consts[0]
    code = next(c for c in factory_code.co_consts if isinstance(c, types.CodeType) and c.co_name == funcdef.name)
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
    values = {**bindings, JST: runtime}
    closure = tuple(cells[n] if n in cells else types.CellType(values[n]) for n in code.co_freevars)
    new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    return new


class _Resolver:
    """Resolve a call's function expression to the converted callee, at conversion time."""

    def __init__(self, fn: types.FunctionType, funcdef: ast.FunctionDef, self_type: type | None):
        self.fn = fn
        self.cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True))
        args = funcdef.args.posonlyargs + funcdef.args.args
        self.self_name = args[0].arg if self_type is not None and args else None
        self.self_type = self_type

    def _lookup(self, name: str) -> Any:
        if name in self.cells:
            try:
                return self.cells[name].cell_contents
            except ValueError:  # an empty cell: assigned later in the enclosing function
                return None
        if name in self.fn.__globals__:
            return self.fn.__globals__[name]
        return None

    def __call__(self, func: ast.expr) -> Any:
        if isinstance(func, ast.Name):
            value = self._lookup(func.id)
            if isinstance(value, nn.Module):
                convert_layer(value)
                return None
            return self._converted(value, None)
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id == self.self_name):
            return self._converted(inspect.getattr_static(self.self_type, func.attr, None), self.self_type)
        return None

    def _converted(self, value: Any, self_type: type | None) -> Any:
        if not is_user_function(value) or _target(value).__code__ in _IN_PROGRESS:
            return None
        try:
            converted = convert_function(value, self_type)
        except ConversionError:
            return None  # called as it is; torch.compile reports it if it cannot be captured
        return converted.function if converted.changed else None

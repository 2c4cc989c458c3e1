"""Every way ``to_static`` / ``jit.save`` can fail to convert or capture a function gives a
:class:`~sampan.jit.Dy2StaticError` that names the user's ``file:line``, the construct and what
to change; an error from torch behind it is chained, never raised on its own.

Each case below is a small function with one failure in it, on the line marked ``# <- here``.
The test checks the error's class, that its message starts with that file and line, and the
words that name the construct and the fix.
"""

from __future__ import annotations

import inspect
import json
import warnings

import pytest
import torch

import sampan
from sampan.jit import ConversionError, Dy2StaticError, ExportError, GraphBreakError, InputSpec

HERE = __file__


# --- conversion (from the source, before any run) ------------------------------------------------
def yields(x):
    yield x  # <- here


def uses_global(x):
    global COUNTER  # <- here
    return x


def for_else(x):
    for row in x:  # <- here
        x = x + row
    else:
        x = x * 2
    return x


def _make_bad_decorator():
    def local_decorator(fn):
        return fn

    @local_decorator  # <- here
    def decorated(x):
        if x.sum() > 0:
            return x * 2
        return x

    return decorated


# --- running converted code ----------------------------------------------------------------------
def one_branch_local(x):
    if x.sum() > 0:  # <- here
        y = x * 2
    return y  # noqa: F821 - unbound when the branch is not taken: the error under test


def grows_in_loop(x):
    while x.sum() < 100:  # <- here
        x = torch.cat([x, x])
    return x


def vector_condition(x):
    if x > 0:  # <- here
        x = x * 2
    return x


def list_replaced(x):
    outs = [x]
    if x.sum() > 0:  # <- here
        outs = [x * 2.0, x]
    return torch.stack(outs)


def list_in_unbounded_loop(x):
    outs = [x]
    i = torch.zeros((), dtype=torch.int64)
    while i < 3:  # <- here
        outs.append(x * i)
        i = i + 1
    return torch.stack(outs)


def list_of_two_shapes(x):
    outs = [x]
    for row in x:
        if row.sum() > 0:  # <- here (where the list becomes a tensor array)
            outs.append(row)
    return torch.stack(outs)


def returns_tensor_array(x):
    outs = []
    for row in x:
        if row.sum() > 0:
            outs.append(row)
    return outs  # <- here


def setitem_partial_slice(x):
    i = x.sum().long().clamp(0, 2)
    x[i, 1:] = 0.0  # <- here
    return x


def string_under_condition(x):
    label = "negative"
    if x.sum() > 0:  # <- here
        label = "positive"
    return x * len(label)


def returns_two_shapes(x):
    if x.sum() > 0:  # <- here
        return x
    return x.sum(0)


def range_tensor_step(x):
    acc = torch.zeros(())
    for i in range(0, x.shape[0] + torch.zeros((), dtype=torch.int64), torch.ones((), dtype=torch.int64)):  # <- here
        acc = acc + i
    return acc


# --- capture failures (the converted code runs, torch cannot make a graph of it) -----------------
def python_number_from_tensor(x):
    acc = torch.zeros(())
    for _ in range(int(x.sum().abs())):  # <- here
        acc = acc + 1
    return acc


def untraceable_call(x):
    return x * (x.data_ptr() % 7)  # <- here


def inplace_in_branch(x):
    if x.sum() > 0:  # <- here
        x.add_(1.0)
    return x


CASES = [
    # (function, input, error class, words the message must contain)
    (yields, torch.ones(2), ConversionError, ["a generator", "Collect the values"]),
    (uses_global, torch.ones(2), ConversionError, ["'global COUNTER' cannot be converted", "argument"]),
    (for_else, torch.ones(2, 2), ConversionError, ["'for ... else' cannot be converted", "flag"]),
    (_make_bad_decorator(), torch.ones(2), ConversionError, ["decorator 'local_decorator'", "module level"]),
    (one_branch_local, torch.ones(2), Dy2StaticError, ["'y' is assigned in only one branch", "Assign it before"]),
    (grows_in_loop, torch.ones(2), Dy2StaticError, ["'x' enters this tensor 'while'", "Preallocate"]),
    (vector_condition, torch.ones(2), Dy2StaticError, ["tensor of shape [2]", ".any() or .all()"]),
    (list_replaced, torch.ones(2), Dy2StaticError, ["'outs' is a list that a branch", "Append to it"]),
    (list_in_unbounded_loop, torch.ones(2), Dy2StaticError, ["not known before it runs", "'for' over a tensor"]),
    (list_of_two_shapes, torch.ones(2, 2), Dy2StaticError, ["tensor array", "of one shape"]),
    (returns_tensor_array, torch.ones(2, 2), Dy2StaticError, ["tensor array", "Return torch.stack"]),
    (setitem_partial_slice, torch.ones(3, 2), Dy2StaticError, ["partial slice", "torch.where"]),
    (string_under_condition, torch.ones(2), Dy2StaticError, ["'label' holds a str", "Make it a tensor"]),
    (returns_two_shapes, torch.ones(2, 2), Dy2StaticError, ["different shapes or dtypes", "one shape and dtype"]),
    (range_tensor_step, torch.ones(3), Dy2StaticError, ["non-zero Python int step"]),
    (python_number_from_tensor, torch.ones(3), GraphBreakError, ["Python number or bool taken from a tensor",
                                                                 "keep the value a tensor"]),
    (untraceable_call, torch.ones(3), GraphBreakError, ["cannot capture", "not_to_static"]),
    (inplace_in_branch, torch.ones(3), Dy2StaticError, ["in-place update", "x = x + 1"]),
]


def _marked_line(fn):
    """The line of ``fn``'s source marked ``# <- here``."""
    fn = getattr(fn, "__wrapped__", fn)
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if "# <- here" in line)


@pytest.mark.parametrize("fn, x, kind, words", CASES, ids=[c[0].__name__ for c in CASES])
def test_each_failure_is_a_dy2static_error_naming_the_line_construct_and_fix(fn, x, kind, words):
    torch._dynamo.reset()
    with pytest.raises(Dy2StaticError) as info:
        sampan.jit.to_static(fn, backend="eager")(x.clone())
    error = info.value
    message = str(error)
    assert isinstance(error, kind), (type(error), message)
    assert message.startswith(f"{HERE}:{_marked_line(fn)}:"), message
    for word in words:
        assert word in message, (word, message)
    # A message from torch is never the whole story: ours comes first, torch's is chained.
    assert not message.startswith(("torch", "Could not", "Dynamo", "Unsupported")), message


def exports_a_python_number(x):
    return x * float(x.sum().tolist())  # <- here


def test_export_failure_is_an_export_error_naming_the_line(tmp_path):
    """torch.export refusing the converted function (here a data-dependent Python float) is an
    ExportError, a Dy2StaticError, naming the line; torch's error is its cause."""
    static = sampan.jit.to_static(exports_a_python_number, backend="eager")
    with pytest.raises(ExportError) as info:
        sampan.jit.save(static, tmp_path / "m", input_spec=[InputSpec([3])])
    message = str(info.value)
    assert message.startswith(f"{HERE}:{_marked_line(exports_a_python_number)}: "), message
    assert "jit.save: torch.export cannot export" in message and "Fix:" in message
    assert info.value.__cause__ is not None


def sorts(x):
    if x.sum() > 0:
        x = x * 2
    return torch.linalg.eigh(x @ x.T)[0]  # an op the ONNX exporter lacks


def test_onnx_failure_keeps_the_pt2_and_says_why_in_sampans_words(tmp_path):
    """If only the ONNX exporter fails, jit.save still writes the .pt2, and the warning and the
    .json's onnx_error give a Dy2StaticError-style message (line, construct, fix) first."""
    static = sampan.jit.to_static(sorts, backend="eager")
    x = torch.randn(3, 3)
    static(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        files = sampan.jit.save(static, tmp_path / "m")
    assert "onnx" not in files and files["pt2"].exists()
    error = json.loads(files["json"].read_text())["onnx_error"]
    assert "jit.save: the ONNX exporter cannot export 'sorts'" in error and "Fix:" in error, error
    assert any("no ONNX file" in str(w.message) for w in caught)
    torch.testing.assert_close(sampan.jit.load(tmp_path / "m")(x), sorts(x))


def user_error(x):
    return x @ torch.ones(5, 5)  # a shape mismatch of the user's own


def test_a_users_own_error_is_raised_as_itself():
    """An error the plain Python function raises too is the user's, not a conversion failure."""
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        sampan.jit.to_static(user_error, backend="eager")(torch.ones(2, 3))
    assert not isinstance(info.value, Dy2StaticError)


def test_library_code_is_torch_the_stdlib_and_the_converter_not_sampans_models():
    """One rule (sampan.jit.library) for the translator and for the line an error names: torch, the
    standard library and sampan.jit are library code; the user's files and sampan's models (whose
    forwards are converted like the user's) are not."""
    import contextlib

    import sampan.jit.runtime.while_loop
    import sampan.models.llama.modeling
    from sampan.jit.library import is_library_file

    for library in (torch.__file__, contextlib.__file__, sampan.jit.runtime.while_loop.__file__):
        assert is_library_file(library), library
    for user in (HERE, sampan.models.llama.modeling.__file__):
        assert not is_library_file(user), user

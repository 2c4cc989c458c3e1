"""Fuzz ``to_static``: random small programs from a grammar of the constructs it converts.

Each generated program nests ``if`` / ``elif`` / ``else``, ``while`` (Python or tensor counter,
with a tensor condition or not), ``for`` (over a Python range, a tensor range, the rows of a
tensor), ``break``, ``continue``, ``return`` at any depth, ``list.append`` under tensor
conditions, tensor indices (``x[j - 1]`` with a loop-carried tensor ``j``), and ``.item()`` /
``float()`` / ``bool()`` in conditions. It runs eagerly (the reference), then must either equal
eager through ``to_static``, the ``jit.save``-d ``.pt2`` and onnxruntime on the ``.onnx``, on two
inputs, or raise :class:`~sampan.jit.Dy2StaticError` (at any step). Any other exception, a
wrong value or a missing ONNX file fails the test.

Hypothesis runs a fixed, derandomized set of examples (CI is deterministic); ``SAMPAN_FUZZ_EXAMPLES``
raises the count for a longer local run.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
import textwrap
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sampan
from sampan.jit import Dy2StaticError

pytestmark = [pytest.mark.slow]

EXAMPLES = int(os.environ.get("SAMPAN_FUZZ_EXAMPLES", "6"))
ROWS = 4  # x is [ROWS, 3]; every tensor value the programs compute is [3]
MAX_DEPTH = 2  # if / while / for nest this deep (a program's compile and export time grows fast with it)


class _Writer:
    """Draws one program's statements from the grammar (hypothesis ``draw``), as source lines."""

    def __init__(self, draw):
        self.draw = draw
        self.names = itertools.count()
        self.appends = False

    def pick(self, options):
        return self.draw(st.sampled_from(options))

    def number(self):
        return self.draw(st.sampled_from(["-1.0", "-0.5", "0.0", "0.5", "1.0", "2.0"]))

    def row(self, scope):
        """A [3] tensor expression readable here (rows the enclosing loops index, or acc)."""
        return self.pick(["acc", *scope["rows"]])

    def term(self, scope):
        row = self.row(scope)
        return self.pick([f"{row} * {self.number()}", f"torch.tanh({row})", f"{row} + {self.number()}",
                          f"{row} - acc * 0.5", f"torch.sin({row}) * 2.0"])

    def condition(self, scope):
        row = self.row(scope)
        c = self.number()
        options = [f"{row}.sum() > {c}", f"acc.mean() < {c}", f"{row}.max().item() > {c}",
                   f"float({row}.mean()) < {c}", f"bool(({row} > {c}).any())", f"int({row}.argmax()) == 1"]
        options += [f"{v} % 2 == 0" for v in scope["python"]]
        cond = self.pick(options)
        combine = self.pick(["", "", "", "and", "or", "not"])
        if combine == "not":
            return f"not ({cond})"
        if combine:
            return f"({cond}) {combine} ({self.pick(options)})"
        return cond

    def block(self, scope, depth, size=None):
        size = size if size is not None else self.draw(st.integers(1, 2))
        lines = []
        for _ in range(size):
            lines += self.statement(scope, depth)
        return lines

    def statement(self, scope, depth):
        kinds = ["assign", "assign", "append"]
        if depth < MAX_DEPTH:
            kinds += ["if", "if", "while", "for"]
        if scope["loops"]:
            kinds += ["break", "continue"]
        kinds += ["return"]
        kind = self.pick(kinds)
        if kind == "assign":
            return [f"acc = {self.term(scope)}"]
        if kind == "append":
            self.appends = True
            return [f"outs.append({self.term(scope)})"]
        if kind in ("break", "continue", "return"):
            stmt = kind if kind != "return" else f"return {self.term(scope)}"
            return [f"if {self.condition(scope)}:", f"    {stmt}"]
        if kind == "if":
            lines = [f"if {self.condition(scope)}:", *_indent(self.block(scope, depth + 1))]
            if self.draw(st.booleans()):
                lines += [f"elif {self.condition(scope)}:", *_indent(self.block(scope, depth + 1))]
            if self.draw(st.booleans()):
                lines += ["else:", *_indent(self.block(scope, depth + 1))]
            return lines
        return self.loop(kind, scope, depth)

    def loop(self, kind, scope, depth):
        n = next(self.names)
        inner = {"rows": list(scope["rows"]), "python": list(scope["python"]), "loops": scope["loops"] + 1}
        if kind == "while":
            j = f"j{n}"
            start = self.pick(["0", "torch.zeros((), dtype=torch.int64)"])
            if start == "0":
                inner["python"].append(j)
            inner["rows"].append(f"x[{j} - 1]")
            test = f"{j} < {ROWS}"
            if self.draw(st.booleans()):
                test += f" and ({self.condition(scope)})"
            body = self.block(inner, depth + 1)
            # The counter moves first, so that `continue` cannot skip it (every loop ends).
            return [f"{j} = {start}", f"while {test}:", f"    {j} = {j} + 1", *_indent(body)]
        form = self.pick(["python", "tensor_range", "rows"])
        if form == "rows":
            row = f"row{n}"
            inner["rows"].append(row)
            return [f"for {row} in x:", *_indent(self.block(inner, depth + 1))]
        k = f"k{n}"
        inner["rows"].append(f"x[{k}]")
        if form == "python":
            inner["python"].append(k)
            return [f"for {k} in range({ROWS}):", *_indent(self.block(inner, depth + 1))]
        return [f"for {k} in range(n):", *_indent(self.block(inner, depth + 1))]


def _indent(lines):
    return ["    " + line for line in lines]


@st.composite
def programs(draw):
    """The source of ``def prog(x, n)``: x is [4, 3] float, n a 0-d int64 tensor in [0, 4]."""
    writer = _Writer(draw)
    body = writer.block({"rows": [], "python": [], "loops": 0}, 0, size=draw(st.integers(2, 4)))
    result = "acc + torch.stack(outs).sum(0)" if writer.appends else "acc"
    lines = ["def prog(x, n):", "    acc = x[0] * 0.5", "    outs = [acc * 0.0]", *_indent(body),
             f"    return {result}"]
    return "\n".join(lines) + "\n"


def _load(source, directory, index):
    """Import the program from a real file: to_static reads its source, dynamo its module."""
    name = f"jit_fuzz_program_{index}"
    path = directory / f"{name}.py"
    path.write_text("import torch\n\n\n" + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.prog, path


INPUTS = [(torch.randn(ROWS, 3, generator=torch.Generator().manual_seed(seed)) * 1.5, torch.tensor(n))
          for seed, n in ((0, 3), (1, 4))]


def _outcome(fn, directory, tag):
    """'converted' or 'refused' (a Dy2StaticError); fails on anything else."""
    expected = [fn(*args) for args in INPUTS]
    try:
        static = sampan.jit.to_static(fn, backend="eager")
        for args, want in zip(INPUTS, expected, strict=True):
            torch.testing.assert_close(static(*args), want, msg=lambda m: f"to_static: {m}")
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)  # a missing ONNX file warns: not allowed here
            files = sampan.jit.save(static, directory / tag)
        assert json.loads(files["json"].read_text())["onnx_error"] is None
        for backend in ("pt2", "onnxruntime"):
            loaded = sampan.jit.load(directory / tag, backend=backend)
            for args, want in zip(INPUTS, expected, strict=True):
                torch.testing.assert_close(loaded(*args), want, msg=lambda m, b=backend: f"{b}: {m}")
    except Dy2StaticError as e:
        message = str(e)
        # The error names the program's own file and line, never only torch's words.
        assert f"{tag}.py:" in message, message
        return "refused"
    return "converted"


def test_random_programs_convert_or_raise_dy2static_error(tmp_path):
    """Every generated program equals eager through to_static, .pt2 and ONNX, or raises
    Dy2StaticError naming its own file; most of them convert."""
    outcomes = []
    counter = itertools.count()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(programs())
    def run(source):
        index = next(counter)
        fn, path = _load(source, tmp_path, index)
        torch._dynamo.reset()
        try:
            outcomes.append(_outcome(fn, tmp_path, path.stem))
        except BaseException:
            print(f"--- failing program ({path}) ---\n{textwrap.indent(source, '  ')}")
            raise

    run()
    converted = outcomes.count("converted")
    assert len(outcomes) >= EXAMPLES and converted >= len(outcomes) // 2, outcomes

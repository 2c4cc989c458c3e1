"""sampan.jit beyond the corpus: the API, caching and stats, errors that name the user's line,
debug output, layers and training, dynamic input specs, export, the GPT early-exit example and
one inductor compile."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import sampan
import sampan as paddle
from sampan.jit import ConversionError, Dy2StaticError, GraphBreakError, InputSpec

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).name


def branchy(x):
    if x.sum() > 0:
        return x * 2
    return x - 1


def test_decorator_forms_and_code():
    plain = sampan.jit.to_static(branchy, backend="eager")

    @sampan.jit.to_static(backend="eager")
    def with_args(x):
        return branchy(x) + 1

    x = torch.randn(4)
    torch.testing.assert_close(plain(x), branchy(x))
    torch.testing.assert_close(with_args(x), branchy(x) + 1)
    assert "_jst.IfElse" in plain.code and "return" in plain.code
    assert plain.dygraph_function is branchy


def test_stats_count_compiles_cache_hits_and_dynamic_specs():
    static = sampan.jit.to_static(branchy, backend="eager")
    static(torch.randn(3))
    static(torch.randn(3))
    static(torch.randn(5))  # a new shape is a new graph without a dynamic spec
    assert static.stats() == {"compiles": 2, "graph_breaks": 0, "cache_hits": 1, "calls": 3}
    dynamic = sampan.jit.to_static(branchy, input_spec=[InputSpec([None])], backend="eager")
    for n in (3, 5, 7):
        torch.testing.assert_close(dynamic(torch.full((n,), 1.0)), torch.full((n,), 2.0))
    assert dynamic.stats()["compiles"] == 1 and dynamic.stats()["cache_hits"] == 2
    with pytest.raises(ValueError, match="does not fit its InputSpec"):
        dynamic(torch.zeros(2, 2))


def test_debug_env_prints_source_after_each_pass(monkeypatch, capsys):
    monkeypatch.setenv("SAMPAN_JIT_DEBUG", "1")

    def debugged(x):
        while x.sum() < 10:
            x = x + 1
        return x

    static = sampan.jit.to_static(debugged, backend="eager")
    static(torch.ones(2))
    err = capsys.readouterr().err
    for name in ("early_return", "ifelse", "while_loop", "undefined_vars"):
        assert f"after pass '{name}'" in err
    assert "_jst.While(" in err


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x)
        if h.mean() > 0:
            h = torch.relu(h)
        else:
            h = -h
        return self.b(h)


def test_layer_training_matches_eager():
    torch.manual_seed(0)
    eager = Net()
    static = Net()
    static.load_state_dict(eager.state_dict())
    static = sampan.jit.to_static(static, backend="aot_eager")
    assert isinstance(static.forward, sampan.jit.StaticFunction)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    opt_s = torch.optim.SGD(static.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(8, 4, generator=gen)
        for model, opt in ((eager, opt_e), (static, opt_s)):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
    for (name, p), q in zip(eager.named_parameters(), static.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-6, msg=name)
    assert static.forward.stats()["graph_breaks"] == 0


def test_method_decorator_gets_a_cache_per_instance():
    class Scaled(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.k = k

        @sampan.jit.to_static(backend="eager")
        def forward(self, x):
            if x.sum() > 0:
                x = x * self.k
            return x

    a, b = Scaled(2.0), Scaled(3.0)
    x = torch.ones(2)
    torch.testing.assert_close(a(x), x * 2)
    torch.testing.assert_close(b(x), x * 3)
    assert a.forward is not b.forward


def test_unsupported_construct_names_file_and_line():
    def gen(x):
        yield x

    with pytest.raises(ConversionError, match=rf"{HERE}:\d+: a generator .*Collect the values"):
        sampan.jit.to_static(gen, backend="eager")(torch.ones(1))


def test_one_branch_variable_error_names_the_if():
    def uses_branch_local(x):
        if x.sum() > 0:
            y = x * 2
        return y

    with pytest.raises(Dy2StaticError, match=rf"{HERE}:\d+: 'y' is assigned in only one branch of this tensor 'if'"):
        sampan.jit.to_static(uses_branch_local, backend="eager")(torch.ones(2))


def test_shape_change_in_tensor_loop_is_a_clear_error():
    def grows(x):
        while x.sum() < 10:
            x = torch.cat([x, x])
        return x

    with pytest.raises(Dy2StaticError, match=rf"{HERE}:\d+: 'x' enters this tensor 'while'.*Preallocate"):
        sampan.jit.to_static(grows, backend="eager")(torch.ones(2))


def test_graph_break_error_names_the_user_line():
    def breaks(x):
        return torch.tensor(x.tolist()) * 2  # .tolist() cannot be captured

    with pytest.raises(GraphBreakError, match=rf"{HERE}:\d+: `return torch.tensor.*`: torch.compile\(fullgraph=True\) "
                                              r"cannot capture '.*breaks' as one graph.*Fix: "):
        sampan.jit.to_static(breaks, backend="eager")(torch.ones(2))


def test_save_needs_a_call_or_spec(tmp_path):
    static = sampan.jit.to_static(branchy, backend="eager")
    with pytest.raises(ValueError, match="call the function once .* or pass input_spec"):
        sampan.jit.save(static, tmp_path / "m")


def masked_mean(x, mask):
    total = (x * mask).sum(dim=1)
    if total.sum() > 0:
        total = total / mask.sum(dim=1).clamp(min=1)
    return total


@pytest.mark.slow
def test_save_infers_dynamic_dims_that_inputs_share(tmp_path):
    """Two inputs with the same `None` dims (ids and mask): jit.save must infer they are equal
    rather than refuse them, and the program then runs at other sizes through .pt2 and ONNX."""
    specs = [InputSpec([None, None], "float32", "x"), InputSpec([None, None], "float32", "mask")]
    static = sampan.jit.to_static(masked_mean, input_spec=specs, backend="eager")
    x, mask = torch.randn(3, 5), (torch.rand(3, 5) > 0.3).float()
    torch.testing.assert_close(static(x, mask), masked_mean(x, mask))
    sampan.jit.save(static, tmp_path / "m")
    meta = json.loads((tmp_path / "m.json").read_text())
    assert [i["shape"] for i in meta["inputs"]] == [[None, None], [None, None]]
    for backend in ("pt2", "onnxruntime"):
        loaded = sampan.jit.load(tmp_path / "m", backend=backend)
        for shape in ((1, 7), (4, 2)):
            x, mask = torch.randn(*shape), (torch.rand(*shape) > 0.3).float()
            torch.testing.assert_close(loaded(x, mask), masked_mean(x, mask), msg=lambda m, b=backend: f"{b}: {m}")


model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def test_seed_snippet_round_trips(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    @paddle.jit.to_static
    def static_forward(x):
        return model(x)

    x = torch.randn(2, 4)
    static_forward.backend = "eager"  # the snippet as written; eager keeps the test fast
    static_forward(x)
    paddle.jit.save(static_forward, "inference_model")
    loaded = paddle.jit.load("inference_model")
    torch.testing.assert_close(loaded(x), model(x))
    meta = json.loads((tmp_path / "inference_model.json").read_text())
    assert meta["inputs"] == [{"name": "x", "shape": [2, 4], "dtype": "float32"}]
    assert meta["outputs"][0]["shape"] == [2, 3] and meta["sampan_version"] == sampan.__version__


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt-tiny", "qwen3-tiny"])
def test_early_exit_decode_example_converts_and_exports(model, tmp_path):
    """Greedy decoding with a tensor early exit, for GPT and for the Llama family (RoPE, GQA, q / k norm)."""
    # Imported under a real module name: torch.compile imports the module of traced functions.
    spec = importlib.util.spec_from_file_location("jit_export_example", ROOT / "examples" / "jit_export.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    result = module.main(["--model", model, "--backend", "eager", "--num-layers", "1", "--max-new-tokens", "6",
                          "--out", str(tmp_path)])
    eager_ids, eager_steps = result["eager"]
    for key in ("static", "pt2", "onnx"):
        ids, steps = result[key]
        assert torch.equal(ids, eager_ids), key
        assert int(steps) == int(eager_steps), key
    prompt = result["prompt"]
    assert int(eager_steps) < prompt.shape[1] + 6  # every row hit EOS: the loop left early
    # The generated tokens are the model's own greedy choice, as its generate() makes them.
    reference = result["model"].generate(prompt, max_new_tokens=int(eager_steps) - prompt.shape[1])
    assert torch.equal(eager_ids[:, :int(eager_steps)], reference)
    assert result["stats"]["graph_breaks"] == 0


@pytest.mark.slow
def test_inductor_backend_with_gradients():
    """The default backend once: cond + while_loop compiled by inductor, forward and backward."""

    def f(x, w):
        y = x @ w
        if y.sum() > 0:
            y = torch.tanh(y)
        else:
            y = torch.sigmoid(y)
        while y.abs().sum() < 10:
            y = y * 2
        return y

    static = sampan.jit.to_static(f)
    x = torch.randn(3, 4)
    w = torch.randn(4, 4, requires_grad=True)
    w2 = w.detach().clone().requires_grad_(True)
    torch.testing.assert_close(static(x, w2), f(x, w), atol=1e-5, rtol=1e-5)
    f(x, w).sum().backward()
    static(x, w2).sum().backward()
    torch.testing.assert_close(w2.grad, w.grad, atol=1e-5, rtol=1e-5)
    assert static.stats()["graph_breaks"] == 0


def test_while_loop_gradients_count_every_iteration():
    """torch 2.13's while_loop backward counts a loop-invariant input once (dx = 4, not 10) and
    back-propagates one iteration through a loop that never ran; sampan's fixes make both exact."""

    def accumulate(x, n):
        acc = torch.zeros_like(x)
        i = torch.zeros((), dtype=torch.int64)
        while i < n:
            acc = acc + x * i
            i = i + 1
        return acc * 1.0

    static = sampan.jit.to_static(accumulate, backend="aot_eager")
    for n, want in ((5, 10.0), (0, 0.0)):
        x = torch.randn(3, requires_grad=True)
        static(x, torch.tensor(n)).sum().backward()
        torch.testing.assert_close(x.grad, torch.full((3,), want))


def if_with_loop_inside_loop(x):
    i = torch.zeros((), dtype=torch.int64)
    while i < 3:
        if x.sum() > 0:  # a branch holding a loop: not lowered to a select (it could run forever)
            while x.abs().sum() > 1:
                x = x * 0.5
        else:
            x = x + 1
        i = i + 1
    return x


def _onnx_nested_ops(graph, inside=()):
    """(op type, enclosing op types) for every node of an ONNX graph and its subgraphs."""
    for node in graph.node:
        yield node.op_type, inside
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _onnx_nested_ops(sub, (*inside, node.op_type))


@pytest.mark.slow
def test_if_holding_a_loop_inside_a_loop_exports_to_onnx(tmp_path):
    """A tensor `if` inside a tensor loop whose branch holds a loop cannot be a select (running
    the untaken branch could loop forever), so it stays a cond: an ONNX `If` inside a `Loop`, which
    the torch 2.13 exporter fails on ("Opset mismatch when inlining function ... __subgraph__")
    without sampan's fix (torch_fixes.onnx_subgraph_opsets). The .pt2 and onnxruntime equal eager."""
    import onnx

    static = sampan.jit.to_static(if_with_loop_inside_loop, input_spec=[InputSpec([2, 3])], backend="eager")
    assert "select=True" not in static.code
    files = sampan.jit.save(static, tmp_path / "loop")
    assert json.loads(files["json"].read_text())["onnx_error"] is None
    nested = set(_onnx_nested_ops(onnx.load(str(files["onnx"])).graph))
    assert any(op == "If" and "Loop" in inside for op, inside in nested), nested
    for backend in ("pt2", "onnxruntime"):
        loaded = sampan.jit.load(tmp_path / "loop", backend=backend)
        for x in (torch.full((2, 3), 4.0), torch.full((2, 3), -0.5)):
            torch.testing.assert_close(loaded(x), if_with_loop_inside_loop(x), msg=lambda m, b=backend: f"{b}: {m}")


def _readme_snippet(heading: str) -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index(heading):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```", start)]


@pytest.mark.slow
def test_readme_to_static_snippet_runs(tmp_path, monkeypatch, capsys):
    """The README's to_static section as written (a data-dependent loop -> .pt2 + ONNX -> jit.load
    -> onnxruntime); only the compile backend is switched to "eager" to keep the test fast."""
    source = _readme_snippet("## Static graphs (`to_static`)")
    assert "to_static(input_spec=[InputSpec([None, 4])])" in source
    path = tmp_path / "readme_to_static.py"
    path.write_text(source.replace("to_static(input_spec=[InputSpec([None, 4])])",
                                   'to_static(input_spec=[InputSpec([None, 4])], backend="eager")'))
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("readme_to_static", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert capsys.readouterr().out.strip().splitlines()[-1] == "True True"
    assert {p.name for p in tmp_path.iterdir()} >= {"normalise.pt2", "normalise.onnx", "normalise.json"}
    assert module.normalise.stats()["graph_breaks"] == 0

"""sampan.inference: export -> Config -> Predictor on ONNX Runtime and torch, int8, bad inputs, CLI.

Real small models (random-init ERNIE / GPT, 1 layer, hidden 64, vocab 500) are exported once per
module (export is the slow part) and shared by the tests.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from sampan.cli import main as cli_main
from sampan.inference import Config, create_predictor, export_model, export_pretrained
from sampan.models.pretrained import from_pretrained
from sampan.models.registry import create
from sampan.static import InputSpec

TINY = {"num_layers": 1, "hidden_size": 64, "num_heads": 2, "vocab_size": 500}
SHAPES = [(1, 5), (3, 17), (2, 9)]  # none is the export's example shape (3 x 3)


def _ids(batch: int, seq: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, TINY["vocab_size"], (batch, seq), dtype=np.int64)


def _mask(batch: int, seq: int) -> np.ndarray:
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[-1, seq // 2 + 1:] = 0  # the last row is padded
    return mask


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("inference")


@pytest.fixture(scope="module")
def ernie(workdir):
    """An ERNIE sentiment-style classifier, saved, then exported through `sampan export`."""
    torch.manual_seed(0)
    model = create("ernie-tiny", head="sequence_classification", **TINY)
    model_dir = model.save_pretrained(workdir / "ernie-model")
    (model_dir / "tokenizer.json").write_text('{"model": "stand-in"}')
    (model_dir / "task.json").write_text('{"task": "sentiment_analysis"}')
    out = workdir / "ernie-export"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = cli_main(["export", "--model-dir", str(model_dir), "--out", str(out)])
    return {"eager": from_pretrained(model_dir).eval(), "dir": out, "model_dir": model_dir, "rc": rc,
            "stdout": stdout.getvalue()}


@pytest.fixture(scope="module")
def gpt(workdir):
    torch.manual_seed(1)
    # A wider init than the default 0.02 spreads the logits, so argmax comparisons (int8) mean something.
    model = create("gpt-tiny", initializer_range=0.1, **TINY).eval()
    out = export_pretrained(model, workdir / "gpt-export", task="text_generation")
    return {"eager": model, "dir": out}


@pytest.fixture(scope="module")
def ernie_predictor(ernie):
    return create_predictor(Config(ernie["dir"]))


def _eager(model, ids, mask=None) -> np.ndarray:
    with torch.no_grad():
        if mask is None:
            return model(torch.from_numpy(ids)).numpy()
        return model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).numpy()


# --- export and equality of backends ---------------------------------------------------------------


@pytest.mark.slow
def test_cli_export_writes_the_directory_with_companion_files(ernie):
    assert ernie["rc"] == 0
    printed = json.loads(ernie["stdout"])
    assert printed["inputs"] == ["input_ids", "attention_mask"] and printed["outputs"] == ["logits"]
    names = sorted(p.name for p in ernie["dir"].iterdir())
    # inference.ort.onnx: the ORT-fused graph, made while the export was verified against the eager model
    assert names == ["config.json", "inference.json", "inference.onnx", "inference.ort.onnx", "inference.pt2",
                     "task.json", "tokenizer.json"]
    assert printed["files"] == names
    assert (ernie["dir"] / "task.json").read_text() == '{"task": "sentiment_analysis"}'
    meta = json.loads((ernie["dir"] / "inference.json").read_text())
    assert [o["name"] for o in meta["outputs"]] == ["logits"]
    assert meta["sampan_model"]["architecture"] == "ErnieForSequenceClassification"
    # batch and sequence are dynamic, tied across the two inputs, and the sequence is capped by the
    # position table (512 positions in ernie-tiny)
    ids, mask = meta["inputs"]
    assert ids["shape"] == mask["shape"] == [None, None]
    assert [d["symbol"] for d in mask["dims"]] == ["input_ids.shape[0]", "input_ids.shape[1]"]
    assert ids["dims"][1]["max"] == 512 and ids["dims"][0]["max"] is None
    # nothing left behind beside it by the atomic write
    assert sorted(p.name for p in ernie["dir"].parent.iterdir() if p.name.startswith(".")) == []


@pytest.mark.slow
def test_cli_export_refuses_an_existing_directory(ernie, capsys):
    rc = cli_main(["export", "--model-dir", str(ernie["model_dir"]), "--out", str(ernie["dir"])])
    assert rc == 2
    assert "already exists: pass overwrite=True (`sampan export --overwrite`)" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_export_takes_a_store_name_and_an_adapter_layout_model(tmp_path, capsys):
    """The shipped sentiment model is a `--save adapter` directory (trained tensors over its base,
    no config.json, no tokenizer): `sampan export ernie-mini-sentiment` merges it over the base and
    exports what Taskflow runs."""
    from sampan.finetune import load_task_model
    from sampan.hub import resolve
    from sampan.text.tokenizer import ChineseTokenizer

    source = resolve("ernie-mini-sentiment")
    assert not (source / "model.safetensors").exists() and "base_model_dir" in json.loads(
        (source / "task.json").read_text(encoding="utf-8"))
    out = tmp_path / "sentiment-export"
    assert cli_main(["export", "--model-dir", "ernie-mini-sentiment", "--out", str(out)]) == 0
    capsys.readouterr()
    meta = json.loads((out / "task.json").read_text(encoding="utf-8"))
    assert "base_model_dir" not in meta and meta["labels"] == ["negative", "positive"]
    base = resolve("ernie-mini-zh")
    assert (out / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    assert json.loads((out / "inference.json").read_text())["sampan_model"]["task"] == "sentiment_analysis"
    tokenizer = ChineseTokenizer.load(out / "tokenizer.json")
    ids = np.array([tokenizer.encode("这家餐厅的服务非常棒").ids], dtype=np.int64)
    mask = np.ones_like(ids)
    eager, _, _ = load_task_model(source)
    expected = _eager(eager.float().eval(), ids, mask)
    np.testing.assert_allclose(create_predictor(Config(out)).run([ids, mask])[0], expected, atol=1e-4)
    assert expected[0].argmax() == 1  # positive, as Taskflow says
    assert cli_main(["export", "--model-dir", "no-such-model", "--out", str(tmp_path / "x")]) == 2
    assert "no-such-model is neither a model directory nor a stored model" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.slow
@pytest.mark.parametrize("batch,seq", SHAPES)
def test_ernie_eager_equals_onnxruntime_equals_torch(ernie, ernie_predictor, batch, seq):
    ids, mask = _ids(batch, seq), _mask(batch, seq)
    expected = _eager(ernie["eager"], ids, mask)
    torch_predictor = create_predictor(Config(ernie["dir"], backend="torch"))
    ort_out, = ernie_predictor.run({"input_ids": ids, "attention_mask": mask})
    pt2_out, = torch_predictor.run({"input_ids": ids, "attention_mask": mask})
    assert ort_out.shape == pt2_out.shape == (batch, 2)
    np.testing.assert_allclose(ort_out, expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(pt2_out, expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(ort_out, pt2_out, atol=1e-5, rtol=0)
    # the mask is really an input: unmasking the padded row changes that row only
    unmasked, = ernie_predictor.run({"input_ids": ids, "attention_mask": np.ones_like(mask)})
    np.testing.assert_allclose(unmasked[:-1], ort_out[:-1], atol=1e-5)
    assert np.abs(unmasked[-1] - ort_out[-1]).max() > 1e-4


@pytest.mark.slow
def test_onnxruntime_fusions_apply_and_compute_the_same(ernie, ernie_predictor, gpt):
    """By default the ONNX Runtime session runs the graph with onnxscript's fusions (attention,
    skip + layer norm, bias + GELU as ORT kernels); ``fuse=False`` runs it as exported. Both give
    the same logits, and a failing rewrite falls back to the exported graph with a warning."""
    fusions = ernie_predictor.fusions
    assert fusions.get("attention") == TINY["num_layers"], fusions  # one fused Attention per block
    assert fusions.get("bias_gelu") == TINY["num_layers"]
    assert "skip_layer_normalization" not in fusions  # split back: ORT's CPU kernel is the slower
    plain = create_predictor(Config(ernie["dir"], fuse=False))
    assert plain.fusions == {}
    ids, mask = _ids(3, 17), _mask(3, 17)
    fused_out, = ernie_predictor.run([ids, mask])
    plain_out, = plain.run([ids, mask])
    np.testing.assert_allclose(fused_out, plain_out, atol=1e-5, rtol=0)
    assert create_predictor(Config(ernie["dir"], backend="torch")).fusions == {}
    # GPT's causal attention becomes MultiHeadAttention ("mha2"), beside the skip + layer norms.
    gpt_fusions = create_predictor(Config(gpt["dir"])).fusions
    assert gpt_fusions.get("mha2") == TINY["num_layers"] and "skip_layer_normalization" not in gpt_fusions


@pytest.mark.slow
@pytest.mark.parametrize("which", ["ernie", "gpt"])
def test_no_skip_layer_norm_kernel_runs(which, ernie, ernie_predictor, gpt, tmp_path):
    """The skip + layer norm pairs stay an Add and a LayerNormalization in the graph ORT runs:
    onnxscript's SkipLayerNormalization nodes are split (ERNIE's post-norm blocks use the normed
    output, GPT's pre-norm blocks also the residual sum), and ORT's own SkipLayerNormFusion, disabled
    by the name sampan passes, does not fuse them again. GPT's logits through that graph are checked
    against eager in test_gpt_eager_equals_onnxruntime_equals_torch."""
    import onnx
    import onnxruntime

    from sampan.inference.fused import ORT_DISABLED_OPTIMIZERS

    export = {"ernie": ernie, "gpt": gpt}[which]["dir"]
    create_predictor(Config(export))  # makes inference.ort.onnx if this session has not yet
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "as_run.onnx")
    onnxruntime.InferenceSession(str(export / "inference.ort.onnx"), options, providers=["CPUExecutionProvider"],
                                 disabled_optimizers=list(ORT_DISABLED_OPTIMIZERS))
    ops = [n.op_type for n in onnx.load(str(tmp_path / "as_run.onnx")).graph.node]
    assert "SkipLayerNormalization" not in ops
    assert ops.count("LayerNormalization") == 2 * TINY["num_layers"] + 1  # per block two, plus one


@pytest.mark.parametrize("batch,seq", SHAPES)
def test_gpt_eager_equals_onnxruntime_equals_torch(gpt, batch, seq):
    ids = _ids(batch, seq, seed=seq)
    expected = _eager(gpt["eager"], ids)
    outs = [create_predictor(Config(gpt["dir"], backend=b)).run([ids])[0] for b in ("onnxruntime", "torch")]
    assert outs[0].shape == (batch, seq, TINY["vocab_size"])
    np.testing.assert_allclose(outs[0], expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(outs[1], expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5, rtol=0)



def _broken_rewriter(path):
    raise RuntimeError("no pattern today")


def _fresh_copy(export_dir: Path, to: Path) -> Path:
    to.mkdir()
    for name in ("inference.json", "inference.onnx", "inference.pt2"):
        shutil.copy(export_dir / name, to / name)
    return to


@pytest.mark.slow
def test_a_failing_rewrite_falls_back_to_the_exported_graph(ernie, ernie_predictor, tmp_path, monkeypatch):
    import sampan.inference.fused as fused

    monkeypatch.setattr(fused, "fused_for_ort", _broken_rewriter)
    fresh = _fresh_copy(ernie["dir"], tmp_path / "fresh")  # nothing cached yet
    with pytest.warns(UserWarning, match=r"fusions failed on inference.onnx \(RuntimeError: no pattern today\); "
                                         r"running the graph as exported \(Config\(fuse=False\)"):
        fallback = create_predictor(Config(fresh))
    assert fallback.fusions == {}
    assert sorted(p.name for p in fresh.iterdir()) == ["inference.json", "inference.onnx", "inference.pt2"]
    ids, mask = _ids(2, 7), _mask(2, 7)
    plain_out, = create_predictor(Config(fresh, fuse=False)).run([ids, mask])
    np.testing.assert_allclose(fallback.run([ids, mask])[0], plain_out, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_the_fused_graph_is_made_once_and_remade_when_stale(ernie, ernie_predictor, tmp_path, monkeypatch):
    """The first load writes inference.ort.onnx beside the export; later loads reuse it without
    running the rewriter; a newer export or another onnxscript version makes it again."""
    import warnings

    import sampan.inference.fused as fused

    export = _fresh_copy(ernie["dir"], tmp_path / "export")
    first = create_predictor(Config(export))
    cached = export / "inference.ort.onnx"
    assert cached.is_file() and first.fusions == ernie_predictor.fusions and first.fusions
    made = cached.stat().st_mtime_ns
    monkeypatch.setattr(fused, "fused_for_ort", _broken_rewriter)  # a rewrite now would fail loudly
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = create_predictor(Config(export))
    assert again.fusions == first.fusions and cached.stat().st_mtime_ns == made
    ids, mask = _ids(3, 9), _mask(3, 9)
    np.testing.assert_array_equal(again.run([ids, mask])[0], first.run([ids, mask])[0])
    monkeypatch.undo()

    # Another onnxscript version: remade, and the new file records that version.
    monkeypatch.setattr(fused, "onnxscript_version", lambda: "9.9.9")
    other = create_predictor(Config(export))
    assert other.fusions == first.fusions and cached.stat().st_mtime_ns != made
    import onnx

    meta = {p.key: p.value for p in onnx.load(str(cached), load_external_data=False).metadata_props}
    assert meta[fused.MADE_BY_KEY] == f"onnxscript 9.9.9; recipe {fused.RECIPE}" == fused.made_by()
    monkeypatch.undo()

    # Another sampan recipe on top of onnxscript's (the split of the skip-layer-norms): remade too.
    made = cached.stat().st_mtime_ns
    monkeypatch.setattr(fused, "RECIPE", "0: an older recipe")
    create_predictor(Config(export))
    meta = {p.key: p.value for p in onnx.load(str(cached), load_external_data=False).metadata_props}
    assert cached.stat().st_mtime_ns != made and meta[fused.MADE_BY_KEY].endswith("recipe 0: an older recipe")
    monkeypatch.undo()

    # A newer export: the fused file is older than its source, so it is made again.
    later = cached.stat().st_mtime + 10
    os.utime(export / "inference.onnx", (later, later))
    monkeypatch.setattr(fused, "fused_for_ort", _broken_rewriter)
    with pytest.warns(UserWarning, match="fusions failed"):
        create_predictor(Config(export))


def test_input_forms_and_casts_give_the_same_result(ernie_predictor):
    ids, mask = _ids(2, 6), _mask(2, 6)
    reference, = ernie_predictor.run({"input_ids": ids, "attention_mask": mask})
    same = [
        ernie_predictor.run([ids, mask])[0],  # a list in input order
        ernie_predictor.run({"input_ids": ids.astype(np.int32), "attention_mask": mask.astype(np.int32)})[0],
        ernie_predictor.run({"input_ids": ids.tolist(), "attention_mask": mask.tolist()})[0],
        ernie_predictor.run({"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)})[0],
        ernie_predictor.run({"input_ids": ids, "attention_mask": mask.astype(bool)})[0],
    ]
    for out in same:
        np.testing.assert_array_equal(out, reference)


def test_handle_style_api(ernie_predictor):
    ids, mask = _ids(3, 8), _mask(3, 8)
    predictor = create_predictor(Config(ernie_predictor.config.model_dir))
    assert predictor.get_input_names() == ["input_ids", "attention_mask"]
    assert predictor.get_output_names() == ["logits"]
    with pytest.raises(RuntimeError, match="output 'logits' has no value yet: call predictor.run"):
        predictor.get_output_handle("logits").copy_to_cpu()
    with pytest.raises(ValueError, match=r"input 'input_ids' has no data: call predictor.get_input_handle"):
        predictor.run()
    for name, array in (("input_ids", ids), ("attention_mask", mask)):
        handle = predictor.get_input_handle(name)
        handle.reshape(array.shape)
        handle.copy_from_cpu(array)
        assert handle.shape() == [3, 8]
    predictor.run()
    out = predictor.get_output_handle("logits").copy_to_cpu()
    assert predictor.get_output_handle("logits").shape() == [3, 2]
    np.testing.assert_array_equal(out, ernie_predictor.run([ids, mask])[0])
    with pytest.raises(ValueError, match=r"reshape\(\) declared \[3, 8\], copy_from_cpu got \[2, 8\]"):
        predictor.get_input_handle("input_ids").copy_from_cpu(ids[:2])
    with pytest.raises(ValueError, match=r"unknown input 'token_type_ids': this model takes \['input_ids'"):
        predictor.get_input_handle("token_type_ids")
    with pytest.raises(ValueError, match=r"unknown output 'probs': this model gives \['logits'\]"):
        predictor.get_output_handle("probs")


IDS, MASK = _ids(2, 7), _mask(2, 7)
BAD_INPUTS = [
    ({"input_ids": IDS}, r"missing input 'attention_mask' \(int64 \[\?, \?\]\); this model takes "
                         r"\['input_ids', 'attention_mask'\]"),
    ({"input_ids": IDS, "attention_mask": MASK, "token_type_ids": IDS},
     r"unknown input 'token_type_ids': this model takes \['input_ids', 'attention_mask'\]"),
    ([IDS], r"this model takes 2 inputs \['input_ids', 'attention_mask'\] \(in that order\), got 1"),
    ({"input_ids": IDS[0], "attention_mask": MASK},
     r"input 'input_ids' takes int64 \[\?, \?\] \(rank 2\), got shape \[7\] \(rank 1\)"),
    ({"input_ids": IDS.astype(np.float32), "attention_mask": MASK},
     r"input 'input_ids' takes int64 \[\?, \?\], got dtype float32; floats are not turned into integers "
     r"silently: .* array.astype\('int64'\)"),
    ({"input_ids": IDS, "attention_mask": MASK[:, :5]},
     r"input 'attention_mask' dim 1 is 5 but must equal input_ids.shape\[1\] = 7 \(the exported model ties"),
    ({"input_ids": IDS, "attention_mask": MASK[:1]},
     r"input 'attention_mask' dim 0 is 1 but must equal input_ids.shape\[0\] = 2"),
    ({"input_ids": np.ones((1, 513), np.int64), "attention_mask": np.ones((1, 513), np.int64)},
     r"input 'input_ids' dim 1 is 513, over the model's limit of 512 .*; truncate the input"),
    ({"input_ids": np.array([["a", "b"]]), "attention_mask": MASK},
     r"input 'input_ids' takes int64 \[\?, \?\], got an array of <U1"),
    ({"input_ids": [[1, 2, 3], [4]], "attention_mask": MASK},
     r"input 'input_ids' is not a rectangular array .*pad the rows to one length"),
    ({"input_ids": np.zeros((2, 0), np.int64), "attention_mask": np.zeros((2, 0), np.int64)},
     r"input 'input_ids' has an empty dim 1"),
]


@pytest.mark.parametrize("inputs,message", BAD_INPUTS)
def test_bad_inputs_are_named(ernie_predictor, inputs, message):
    with pytest.raises(ValueError, match=message):
        ernie_predictor.run(inputs)


def test_a_bare_array_is_refused_with_the_fix(ernie_predictor):
    with pytest.raises(TypeError, match=r"inputs must be a dict name -> array or a list in the order "
                                        r"\['input_ids', 'attention_mask'\], got ndarray; e.g. run\("):
        ernie_predictor.run(IDS)


# --- Config -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_config_errors_name_the_fix(ernie, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist: export it with "
                                                r"sampan.inference.export_pretrained\(...\) or `sampan export`"):
        Config(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no inference.json in .*: it is not an inference directory"):
        Config(ernie["model_dir"])
    only_pt2 = tmp_path / "only-pt2"
    only_pt2.mkdir()
    for name in ("inference.json", "inference.pt2"):
        shutil.copy(ernie["dir"] / name, only_pt2 / name)
    with pytest.raises(FileNotFoundError, match=r"no inference.onnx in .*only-pt2: export it with "
                                                r"sampan.inference.export_pretrained\(...\) or `sampan export` "
                                                r"or use backend='torch' \(the .pt2 is there\)"):
        Config(only_pt2)
    assert Config(only_pt2, backend="torch").backend == "torch"
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'; choose one of onnxruntime, torch"):
        Config(ernie["dir"], backend="tensorrt")
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'"):  # the field first, not "no inference.json"
        Config(tmp_path, backend="tensorrt")
    with pytest.raises(ValueError, match="unknown precision 'fp16'; choose one of fp32, int8"):
        Config(ernie["dir"], precision="fp16")
    with pytest.raises(ValueError, match="precision='int8' runs on ONNX Runtime's integer kernels: use "
                                         "backend='onnxruntime'"):
        Config(ernie["dir"], backend="torch", precision="int8")
    with pytest.raises(ValueError, match="num_threads must be a positive int or None"):
        Config(ernie["dir"], num_threads=0)
    with pytest.raises(ValueError, match="fuse must be True or False, got 'yes'"):
        Config(ernie["dir"], fuse="yes")


@pytest.mark.slow
def test_paddle_style_setters(ernie):
    config = Config(ernie["dir"])
    config.set_cpu_math_library_num_threads(1)
    config.switch_backend("torch")
    assert (config.num_threads, config.backend, config.precision) == (1, "torch", "fp32")
    with pytest.raises(ValueError, match="use backend='onnxruntime'"):
        config.enable_int8()
    assert config.precision == "fp32"  # a rejected change leaves the config as it was
    config.switch_backend("onnxruntime")
    config.enable_int8()
    assert config.precision == "int8"
    with pytest.raises(ValueError, match="unknown backend 'tvm'"):
        config.switch_backend("tvm")
    assert config.backend == "onnxruntime"
    config.switch_ir_optim(False)
    assert config.fuse is False
    with pytest.raises(ValueError, match="fuse must be True or False"):
        config.switch_ir_optim("off")
    assert config.fuse is False


# --- int8 ---------------------------------------------------------------------------------------------


def test_int8_is_smaller_and_close_to_fp32(gpt):
    onnx_path = gpt["dir"] / "inference.onnx"
    int8 = create_predictor(Config(gpt["dir"], precision="int8"))
    assert int8.model_path == gpt["dir"] / "inference.int8.onnx"
    size_ratio = int8.model_path.stat().st_size / onnx_path.stat().st_size
    assert size_ratio < 0.5  # int8 weights incl. the embedding table (fp32 is 4 bytes a weight)
    fp32 = create_predictor(Config(gpt["dir"]))
    ids = _ids(4, 16, seed=7)
    full, = fp32.run([ids])
    quantized, = int8.run([ids])
    relative_error = np.linalg.norm(quantized - full) / np.linalg.norm(full)
    agreement = (quantized.argmax(-1) == full.argmax(-1)).mean()
    assert 0 < relative_error < 0.05
    assert agreement >= 0.9
    # made once and reused
    mtime = int8.model_path.stat().st_mtime_ns
    again = create_predictor(Config(gpt["dir"], precision="int8"))
    assert again.model_path == int8.model_path and again.model_path.stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(again.run([ids])[0], quantized)


@contextlib.contextmanager
def _read_only(directory: Path):
    """Make ``directory`` unwritable; as root (which ignores modes) mark it immutable with chattr."""
    os.chmod(directory, 0o555)
    immutable = False
    if os.access(directory, os.W_OK):
        immutable = subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0
    try:
        probe = directory / ".probe"
        try:
            probe.write_text("x")
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("cannot make a read-only directory here (root without CAP_LINUX_IMMUTABLE)")
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        os.chmod(directory, 0o755)


def test_int8_of_a_read_only_model_goes_to_the_sampan_home_cache(gpt, tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in ("inference.json", "inference.onnx", "inference.pt2"):
        shutil.copy(gpt["dir"] / name, shipped / name)
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    import hashlib

    digest = hashlib.sha256((shipped / "inference.onnx").read_bytes()).hexdigest()
    with _read_only(shipped):
        predictor = create_predictor(Config(shipped, precision="int8"))
        assert predictor.model_path == tmp_path / "home" / "cache" / "int8" / f"{digest}.onnx"
        assert sorted(p.name for p in shipped.iterdir()) == ["inference.json", "inference.onnx", "inference.pt2"]
        mtime = predictor.model_path.stat().st_mtime_ns
        again = create_predictor(Config(shipped, precision="int8"))
        assert again.model_path.stat().st_mtime_ns == mtime  # reused, not remade
    # the same quantization as the one written beside a writable copy
    ids = _ids(2, 6)
    beside = create_predictor(Config(gpt["dir"], precision="int8"))
    np.testing.assert_array_equal(predictor.run([ids])[0], beside.run([ids])[0])
    # beside the int8 file (the cache is writable): its fused graph
    assert sorted(p.name for p in (tmp_path / "home" / "cache" / "int8").iterdir()) == [f"{digest}.onnx",
                                                                                      f"{digest}.ort.onnx"]


# --- export_model: any function, atomic writes ---------------------------------------------------------


class _Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x) * 2




@pytest.mark.slow
def test_export_model_fixed_dims_float_casts_and_atomic_overwrite(tmp_path):
    torch.manual_seed(0)
    layer = _Scale().eval()
    out = export_model(layer, tmp_path / "scale", [InputSpec([None, 4], "float32", "x")], output_names=["y"])
    predictor = create_predictor(Config(out))
    assert predictor.get_output_names() == ["y"]
    x = np.random.default_rng(0).standard_normal((5, 4))
    with torch.no_grad():
        expected = layer(torch.from_numpy(x).float()).numpy()
    np.testing.assert_allclose(predictor.run({"x": x})[0], expected, atol=1e-6)  # float64 cast silently
    np.testing.assert_allclose(predictor.run({"x": np.ones((1, 4), np.int64)})[0],
                               layer(torch.ones(1, 4)).detach().numpy(), atol=1e-6)  # ints widen to float
    with pytest.raises(ValueError, match=r"input 'x' dim 1 must be 4 \(float32 \[\?, 4\]\), got shape \[5, 3\]"):
        predictor.run({"x": x[:, :3]})

    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(FileExistsError, match="already exists: pass overwrite=True"):
        export_model(layer, out, [InputSpec([None, 4], "float32", "x")])

    def reject(directory):
        raise RuntimeError("verification failed")

    with pytest.raises(RuntimeError, match="verification failed"):
        export_model(_Scale(), out, [InputSpec([None, 4], "float32", "x")], overwrite=True, verify=reject)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old export is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scale"]  # no temporary directory left


def test_a_failing_export_leaves_no_directory(tmp_path):
    # an input spec that does not fit the layer (4 features into Linear(4, 3) is right; 5 is not)
    with pytest.raises(RuntimeError, match="must have same reduction dim"):
        export_model(_Scale(), tmp_path / "broken", [InputSpec([None, 5], "float32", "x")])
    assert list(tmp_path.iterdir()) == []


def test_export_pretrained_refuses_what_it_cannot_export(tmp_path):
    with pytest.raises(TypeError, match="export_pretrained takes a sampan model with a sequence_classification / "
                                        "token_classification / masked_lm / causal_lm head, got ErnieModel"):
        export_pretrained(create("ernie-tiny", head="none", **TINY), tmp_path / "x")
    with pytest.raises(ValueError, match="the model embeds pinyin features: pass features=CharFeatures.load"):
        export_pretrained(create("ernie-tiny", head="sequence_classification", pinyin_vocab_size=50, **TINY),
                          tmp_path / "y")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_model_with_character_features_exports_with_the_lookup_inside_the_graph(tmp_path, asgi_post):
    """Pinyin / radical / stroke ids are not inputs of the graph: it gathers them from the
    features table, so the exported model takes (input_ids, attention_mask) like any other and
    computes what the eager model computes given the looked-up ids."""
    from sampan.inference import export_model_dir
    from sampan.text import CharFeatures, ChineseTokenizer, load_corpus

    tokenizer = ChineseTokenizer.train([d.text for d in load_corpus("news", "train")[:300]], vocab_size=400)
    features = CharFeatures.build(tokenizer.tokens())
    torch.manual_seed(0)
    config = {**TINY, "vocab_size": tokenizer.vocab_size, **features.vocab_sizes()}
    model = create("ernie-tiny", head="sequence_classification", initializer_range=0.2, **config).eval()
    model_dir = model.save_pretrained(tmp_path / "with-features")
    tokenizer.save(model_dir / "tokenizer.json")
    features.save(model_dir / "features.json")
    out = export_model_dir(model_dir, tmp_path / "export")
    assert [i["name"] for i in json.loads((out / "inference.json").read_text())["inputs"]] == ["input_ids",
                                                                                                 "attention_mask"]
    assert (out / "features.json").is_file() is False  # nothing to ship: the table is in the graph
    ids = np.array([e.ids for e in tokenizer.encode_batch(["新华社北京电", "中国人民"])], dtype=object)
    width = max(len(row) for row in ids)
    batch = np.zeros((2, width), dtype=np.int64)
    mask = np.zeros((2, width), dtype=np.int64)
    for row, seq in enumerate(ids):
        batch[row, : len(seq)], mask[row, : len(seq)] = seq, 1
    looked_up = features.lookup(torch.from_numpy(batch))
    with torch.no_grad():
        expected = model(torch.from_numpy(batch), attention_mask=torch.from_numpy(mask), **looked_up).numpy()
        without = model(torch.from_numpy(batch), attention_mask=torch.from_numpy(mask),
                        **{k: torch.zeros_like(v) for k, v in looked_up.items()}).numpy()  # every id "none"
    assert np.abs(expected - without).max() > 1e-3  # the features matter, so the check below means something
    for backend in ("onnxruntime", "torch"):
        got = create_predictor(Config(out, backend=backend)).run([batch, mask])[0]
        np.testing.assert_allclose(got, expected, atol=1e-4)
    int8 = create_predictor(Config(out, precision="int8")).run([batch, mask])[0]
    assert int8.shape == expected.shape and np.abs(int8 - expected).max() < 0.1 * np.abs(expected).max()
    from sampan.serving import create_app

    served = asgi_post(create_app(model_dirs={"m": str(out)}), "/v1/models/m/predict",
                       {"inputs": {"input_ids": batch.tolist(), "attention_mask": mask.tolist()}})
    assert served.status_code == 200, served.text
    np.testing.assert_allclose(np.asarray(served.json()["outputs"]["logits"], dtype=np.float32), expected, atol=1e-4)
    other = CharFeatures(features.pinyin_vocab, features.radical_vocab, features.table[:10])
    with pytest.raises(ValueError, match="features cover 10 token ids but the model's vocab_size is"):
        export_pretrained(model, tmp_path / "z", features=other)


def test_split_skip_layer_norms_keeps_a_node_whose_statistics_are_read():
    """A SkipLayerNormalization whose mean output is used cannot become Add + LayerNormalization
    (that op's statistics are not the same outputs); it is left alone, and the graph still runs."""
    import onnx
    import onnx_ir
    import onnxruntime
    from onnx import TensorProto, helper

    from sampan.inference.fused import split_skip_layer_norms

    def graph(outputs: list[str]) -> onnx_ir.Model:
        node = helper.make_node("SkipLayerNormalization", ["x", "s", "g", "b"], ["y", "mean"], domain="com.microsoft",
                                epsilon=1e-5)
        value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 4]) for n in ("x", "s")]
        shapes = {"y": [2, 3, 4], "mean": [2, 3, 1]}
        made = helper.make_graph([node], "g", value, [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n])
                                                      for n in outputs],
                                 [helper.make_tensor("g", TensorProto.FLOAT, [4], [1.0] * 4),
                                  helper.make_tensor("b", TensorProto.FLOAT, [4], [0.5] * 4)])
        proto = helper.make_model(made, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        return onnx_ir.from_proto(proto)

    reads_mean = graph(["y", "mean"])
    assert split_skip_layer_norms(reads_mean) == 0
    assert [n.op_type for n in reads_mean.graph] == ["SkipLayerNormalization"]
    plain = graph(["y"])
    assert split_skip_layer_norms(plain) == 1
    assert [n.op_type for n in plain.graph] == ["Add", "LayerNormalization"]
    x, s = np.random.default_rng(0).standard_normal((2, 2, 3, 4)).astype(np.float32)
    session = onnxruntime.InferenceSession(onnx_ir.to_proto(plain).SerializeToString(), providers=["CPUExecutionProvider"])
    t = x + s
    expected = (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-5) + 0.5
    np.testing.assert_allclose(session.run(None, {"x": x, "s": s})[0], expected, atol=1e-5)
    assert onnx.checker.check_model(onnx_ir.to_proto(plain)) is None

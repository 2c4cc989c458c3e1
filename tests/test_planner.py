"""sampan plan: memory formulas against measured bytes, search validity, time-model shape, CLI, run files."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

from sampan.cli import main
from sampan.distributed.strategy import DistributedStrategy
from sampan.models.registry import get_config
from sampan.planner import (
    Layout,
    ModelShape,
    Workload,
    evaluate,
    get_hardware,
    layouts,
    load_model,
    search,
    shape_from_config,
)
from sampan.planner.memory import head_activation_bytes, layer_activation_bytes, memory, stage_params
from sampan.planner.time import step_time

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


# --- memory against measurements ---------------------------------------------------------------
def _hybrid_results():
    path = RESULTS / "hybrid_parallel.json"
    # Committed measurements: a missing file is a broken checkout, not a reason to skip.
    assert path.is_file(), "benchmarks/results/hybrid_parallel.json is missing (run benchmarks/hybrid_parallel.py)"
    return json.loads(path.read_text())


def test_model_state_bytes_match_fleet_measurements():
    """Parameter / gradient / optimizer bytes per rank, as measured on real gloo fleet runs (11 layouts)."""
    data = _hybrid_results()
    sh = data["shape"]
    model = ModelShape("bench", sh["layers"], sh["hidden"], sh["heads"], sh["vocab"], max_positions=sh["seq_len"])
    assert model.num_parameters == data["parameters"]
    keys = {"param_bytes": 4, "grad_bytes": 4, "optimizer_bytes": 8}
    for row in data["layouts"]:
        lay = row["layout"]
        layout = Layout(dp=lay["dp"], mp=lay["mp"], pp=lay["pp"], sharding=lay["sharding"], stage=lay["stage"],
                        sp=lay["sp"])
        n = max(stage_params(model, layout, s) for s in range(layout.pp)) / layout.sharding
        measured = row["memory_bytes_per_rank"]["measured_max_over_ranks"]
        for key, per_param in keys.items():
            assert n * per_param == pytest.approx(measured[key], rel=0.10), (lay["name"], key)


@pytest.mark.parametrize("mode", ["none", "full"])
def test_activation_bytes_match_a_fresh_measurement(mode):
    """Bytes a small GPT saves for backward (unique non-parameter storages) against the formula."""
    from sampan.models import create
    from sampan.nn.recompute import apply_recompute

    torch.manual_seed(0)
    L, h, a, V, s, b = 2, 64, 4, 512, 64, 2
    model = create("gpt-tiny", hidden_size=h, num_layers=L, num_heads=a, vocab_size=V, max_position_embeddings=s)
    apply_recompute(model, mode)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, V, (b, s))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    shape = ModelShape("t", L, h, a, V, max_positions=s)
    layout, work = Layout(micro_batch=b, recompute=mode), Workload(s, b, None)
    predicted = L * layer_activation_bytes(shape, layout, work, mode) + head_activation_bytes(shape, layout, work)
    assert predicted == pytest.approx(sum(saved.values()), rel=0.05)


def _saved_bytes(model, ids, amp: bool) -> int:
    """Bytes of the non-parameter storages a forward saves for backward (autocast's bf16 weight
    copies left out: the planner counts them as buffers). A model cast to bf16 stands for AMP level
    O2, where FSDP2 hands the forward bf16 parameters."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape)[::-1] for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and not (t.dtype == torch.bfloat16 and tuple(t.shape) in weight_shapes):
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            model(input_ids=ids, labels=ids)
    return sum(saved.values())


@pytest.mark.parametrize("precision", ["fp32", "O1", "O2"])
@pytest.mark.parametrize("mode", ["none", "full"])
@pytest.mark.parametrize("name", ["llama-tiny", "qwen3-tiny", "gpt-tiny"])
def test_activation_bytes_match_a_fresh_measurement_per_precision(name, mode, precision):
    """GQA (k, v of 2 heads, q of 4), SwiGLU, RMSNorm and (Qwen3) q/k norms, and GPT's LayerNorm
    blocks, as sampan's eager models keep them: in fp32, under CPU bf16 autocast (O1, whose
    per-projection casts of a norm's output the formula counts) and with bf16 parameters (O2)."""
    from sampan.models import create
    from sampan.nn.recompute import apply_recompute

    torch.manual_seed(0)
    b, s = 3, 40  # 120 tokens: no activation has a weight's shape
    model = create(name)
    if precision == "O2":
        model = model.to(torch.bfloat16)
    apply_recompute(model, mode)
    measured = _saved_bytes(model, torch.randint(0, model.config.vocab_size, (b, s)), precision == "O1")
    shape = load_model(name)
    layout = Layout(micro_batch=b, recompute=mode, amp_level="O2" if precision == "O2" else "O1")
    work = Workload(s, b, None if precision == "fp32" else "bf16")
    predicted = shape.layers * layer_activation_bytes(shape, layout, work, mode) + head_activation_bytes(shape, layout,
                                                                                                         work)
    assert predicted == pytest.approx(measured, rel=0.03)


def _rank_params(model, mp: int, pp: int, stage: int) -> float:
    """Parameters of one tensor-parallel rank of pipeline ``stage``, read off the real module tree and
    the Llama family's tensor-parallel plan (column-parallel: weight and bias split; row-parallel:
    weight split, bias whole; vocab: split; the rest whole)."""
    import fnmatch

    from sampan.models.llama.parallelize import TP_PLAN

    layers = model.config.num_layers
    per_stage = -(-layers // pp)
    total = 0.0
    seen = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if name == "lm_head.weight" and model.config.tie_word_embeddings and pp == 1:
            continue  # one tensor with the embedding on a single stage
        module, _, kind = name.rpartition(".")
        if module.startswith("model.layers."):
            where = int(module.split(".")[2]) // per_stage
        else:
            where = 0 if module == "model.embed_tokens" else pp - 1
        if where != stage or (name, where) in seen:
            continue
        seen.add((name, where))
        styles = [style for pattern, style in TP_PLAN.items() if fnmatch.fnmatchcase(module, pattern)]
        style = next((st for st in styles if st != "shared_input"), "replicated")
        split = style in ("colwise", "vocab") or (style == "rowwise" and kind == "weight")
        total += param.numel() / mp if split else param.numel()
    return total


@pytest.mark.parametrize("name, overrides", [
    ("llama-tiny", {}),
    ("qwen2-tiny", {}),                                                    # q/k/v biases, tied head
    ("qwen3-tiny", {}),                                                    # q/k norms, H d = 128 != h = 64
    ("llama-tiny", {"qkv_bias": True, "out_bias": True, "mlp_bias": True}),  # row-parallel biases replicated
])
def test_llama_stage_params_per_rank_match_the_tensor_parallel_plan(name, overrides):
    from sampan.models import create

    config = get_config(name, **overrides)
    shape = shape_from_config(name, config)
    model = create(config, device="meta")
    for mp, pp in ((1, 1), (2, 1), (2, 2), (1, 2)):
        layout = Layout(mp=mp, pp=pp, num_micro=pp)
        for stage in range(pp):
            assert stage_params(shape, layout, stage) == _rank_params(model, mp, pp, stage), (mp, pp, stage)


def test_llama_tiny_params_per_rank_by_hand():
    """llama-tiny at mp=2: h 64, 4 heads / 2 KV heads of 16, SwiGLU 176, vocab 512, untied, 2 layers."""
    shape = load_model("llama-tiny")
    h, q, kv, f, V = 64, 4 * 16, 2 * 16, 176, 512
    split = h * q + 2 * h * kv + q * h + 3 * h * f   # q, k, v, o and gate / up / down: 46,080
    per_layer = split / 2 + 2 * h                    # the two RMSNorm weights stay whole on each rank
    assert per_layer == 23_168
    assert stage_params(shape, Layout(mp=2), 0) == 2 * per_layer + V * h / 2 + h + V * h / 2 == 79_168
    assert shape.layer_params_per_mp(1) == shape.layer_params == split + 2 * h


def test_gqa_keeps_less_than_multi_head_attention():
    """Llama 3 8B (8 KV heads) against the same model with 32: k and v shrink, q and the rest do not."""
    gqa = load_model("llama3-8b")
    mha = shape_from_config("llama3-8b-mha", get_config("llama3-8b", num_kv_heads=32))
    assert mha.kv_heads == 32 and gqa.kv_heads == 8
    d, s, b, t = 128, 4096, 2, 2
    work, layout = Workload(s, 16), Layout(dp=1, mp=t, pp=1, micro_batch=b, num_micro=8)
    for mode in ("none", "selective"):
        saved = layer_activation_bytes(mha, layout, work, mode) - layer_activation_bytes(gqa, layout, work, mode)
        assert saved == 2 * 2 * s * b * (32 - 8) * d / t  # k and v, bf16, on one of t ranks
    assert layer_activation_bytes(mha, layout, work, "full") == layer_activation_bytes(gqa, layout, work, "full")
    assert mha.layer_params - gqa.layer_params == 2 * 4096 * (32 - 8) * d
    m_gqa, m_mha = memory(gqa, layout, work), memory(mha, layout, work)
    assert m_gqa.activations < m_mha.activations and m_gqa.params < m_mha.params and m_gqa.total < m_mha.total
    # FLOPs: only the k / v projections shrink; every query head still attends over the sequence
    assert mha.flops_per_token(s) - gqa.flops_per_token(s) == 6 * 32 * 2 * 4096 * (32 - 8) * d


def test_activation_bytes_match_profiled_recompute_benchmark():
    """benchmarks/trainer.py profiles GPT activation memory for none / selective / full (fp32)."""
    path = RESULTS / "trainer.json"
    assert path.is_file(), "benchmarks/results/trainer.json is missing (run benchmarks/trainer.py)"
    run = json.loads(path.read_text())["recompute"]["gpt"]
    c = run["config"]
    shape = ModelShape("gpt", c["layers"], c["hidden"], c["heads"], c["vocab"], c["intermediate"], c["seq_len"])
    work = Workload(c["seq_len"], c["batch"], None)
    for mode in ("none", "selective", "full"):
        layout = Layout(micro_batch=c["batch"], recompute=mode)
        predicted = (c["layers"] * layer_activation_bytes(shape, layout, work, mode)
                     + head_activation_bytes(shape, layout, work))
        assert predicted == pytest.approx(run["modes"][mode]["activation_mib"] * 2**20, rel=0.10), mode


def test_memory_orders_as_it_should():
    model, work = load_model("gpt-13b"), Workload(2048, 512)
    base = dict(dp=1, mp=8, pp=4, micro_batch=1, num_micro=8)
    total = {mode: memory(model, Layout(**base, recompute=mode), work).total for mode in ("none", "selective", "full")}
    assert total["full"] < total["selective"] < total["none"]
    zero = {st: memory(model, Layout(dp=1, sharding=8, stage=st, micro_batch=1, num_micro=8), work)
            for st in (2, 3)}
    assert zero[3].total < zero[2].total and zero[3].params == zero[2].params  # stage 3 holds fewer working copies
    gpipe = memory(model, Layout(**{**base, "num_micro": 16}, schedule="GPipe"), work).activations
    one_f = memory(model, Layout(**{**base, "num_micro": 16}), work).activations
    assert gpipe > 3 * one_f  # GPipe keeps every micro-batch, 1F1B at most pp


# --- time model --------------------------------------------------------------------------------
def test_pipeline_bubble_follows_the_closed_form():
    model, work, hw = load_model("gpt-13b"), Workload(2048, 512), get_hardware("a100-80g")
    p, m = 4, 16
    t = step_time(model, Layout(dp=1, mp=8, pp=p, micro_batch=1, num_micro=m), work, hw)
    slot = (t.compute + t.tensor_parallel) / m
    assert t.bubble == pytest.approx((p - 1) * slot)
    ti = step_time(model, Layout(dp=1, mp=8, pp=p, micro_batch=1, num_micro=m, schedule="Interleaved1F1B", vpp=2),
                   work, hw)
    assert ti.bubble == pytest.approx(t.bubble / 2)
    assert ti.pipeline_p2p > t.pipeline_p2p  # more boundaries to cross


def test_tensor_parallel_across_nodes_is_slower():
    model, work = load_model("gpt-13b"), Workload(2048, 64)
    layout = Layout(dp=1, mp=8, pp=1, micro_batch=1, num_micro=64)
    inside = step_time(model, layout, work, get_hardware("a100-80g"))
    across = step_time(model, layout, work, get_hardware("a100-80g", gpus_per_node=4))
    assert across.tensor_parallel > 5 * inside.tensor_parallel


# --- search ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpt-1.3b", "qwen2.5-7b"])
def test_every_searched_layout_is_one_sampan_accepts(name):
    model, gpus, work, hw = load_model(name), 32, Workload(1024, 64), get_hardware("h100-80g")
    seen, mps, both = 0, set(), False
    for layout in layouts(model, gpus, work, hw):
        seen += 1
        mps.add(layout.mp)
        assert layout.gpus == gpus
        assert layout.num_micro * layout.micro_batch * layout.data_ranks == work.global_batch
        strategy = layout.to_strategy()
        degrees = strategy.resolve_degrees(gpus)
        strategy.validate_for_model(model.heads, model.layers, model.padded_vocab(layout.mp), degrees,
                                    num_kv_heads=model.kv_heads)
        assert DistributedStrategy.from_dict(strategy.to_dict()) == strategy
        both = both or (layout.sp and layout.pp > 1)
    assert seen > 100
    assert both  # sequence parallel inside pipelines is searched (fleet runs it)
    # qwen2.5-7b: 28 heads but 4 KV heads, so mp 8 (which the GPUs and a node allow) is never tried
    assert mps == ({1, 2, 4, 8} if name == "gpt-1.3b" else {1, 2, 4})


def test_search_ranks_fitting_layouts_fastest_first():
    model, work, hw = load_model("gpt-13b"), Workload(2048, 256), get_hardware("a100-80g")
    result = search(model, 64, work, hw, top=20)
    assert result.plans and result.fitting >= len(result.plans)
    times = [p.time.total for p in result.plans]
    assert times == sorted(times)
    assert all(p.fits and p.memory.total <= hw.memory_bytes for p in result.plans)
    # MFU counts the attention as 12 L h s per token, the time its causal half: the bound is the
    # efficiency times that ratio.
    full = model.flops_per_token(work.seq_len)
    bound = hw.efficiency(model.hidden) * full / (full - 6 * model.layers * model.q_width * work.seq_len)
    assert all(0 < p.mfu < bound + 1e-9 for p in result.plans)


def test_search_for_175b_on_1024_gpus_is_fast():
    start = time.perf_counter()
    result = search(load_model("gpt-175b"), 1024, Workload(2048, 1536), get_hardware("a100-80g"))
    assert time.perf_counter() - start < 30  # loose: the goal is < 10 s, a shared CI machine is slower
    assert result.considered > 1000 and result.plans
    best = result.plans[0]
    assert best.layout.mp <= 8 and best.fits


def test_fixed_layout_prices_like_the_search():
    model, work, hw = load_model("gpt-175b"), Workload(2048, 1536), get_hardware("a100-80g")
    best = search(model, 1024, work, hw, top=1).plans[0]
    again = evaluate(model, best.layout, work, hw)
    assert again.time.total == best.time.total and again.memory.total == best.memory.total


# --- CLI ---------------------------------------------------------------------------------------
def _plan(capsys, *args):
    rc = main(["plan", *args])
    return rc, capsys.readouterr()


def test_cli_json_table_and_fix(capsys):
    rc, out = _plan(capsys, "--model", "gpt-13b", "--gpus", "64", "--hardware", "a100-80g", "--global-batch", "256",
                    "--top", "3", "--json")
    assert rc == 0
    data = json.loads(out.out)
    assert len(data["rows"]) == 3 and data["search"]["considered"] >= data["search"]["fitting"] > 0
    for key in ("dp", "sharding", "pp", "mp", "micro_batch", "recompute", "memory_gb", "step_s", "tokens_per_s",
                "mfu", "bottleneck"):
        assert key in data["rows"][0]
    rc, out = _plan(capsys, "--model-shape", "layers=40,hidden=5120,heads=40,vocab=51200", "--gpus", "64",
                    "--global-batch", "256", "--fix", "mp=8,pp=4,micro_batch=1,recompute=full,schedule=interleaved,vpp=2",
                    "--json")
    assert rc == 0
    row = json.loads(out.out)["rows"][0]
    assert (row["dp"], row["mp"], row["pp"], row["vpp"], row["recompute"]) == (2, 8, 4, 2, "full")
    assert row["micro_batches"] == 128
    rc, out = _plan(capsys, "--model", "gpt-1.3b", "--gpus", "16", "--global-batch", "64", "--top", "2")
    assert rc == 0 and "tokens/s" in out.out and "MFU" in out.out


@pytest.mark.parametrize("args, message", [
    (["--model", "gpt-13b", "--gpus", "12"], "whole number of nodes"),
    (["--model", "gpt-nope", "--gpus", "8"], "neither a model name"),
    (["--model", "gpt-13b", "--gpus", "8", "--fix", "mp=3"], "does not divide"),
    (["--model", "gpt-13b", "--gpus", "8", "--fix", "mp=8,pp=2"], "does not divide --gpus 8"),
    (["--model", "gpt-13b", "--gpus", "16", "--fix", "dp=4,mp=8"], "--gpus is 16"),
    (["--model", "gpt-13b", "--gpus", "8", "--fix", "bogus=1"], "KEY=VALUE"),
    (["--model", "gpt-175b", "--gpus", "8", "--global-batch", "8"], "fits in 80 GB"),
    (["--model", "gpt-13b", "--gpus", "64", "--global-batch", "7"], "no valid layout"),
    (["--model-shape", "layers=2,hidden=64", "--gpus", "8"], "needs ['heads', 'vocab']"),
    (["--model", "qwen2.5-1.5b", "--gpus", "8", "--fix", "mp=4"], "mp 4 does not divide the 2 key/value heads"),
    (["--model-shape", "layers=2,hidden=64,heads=4,vocab=512,kv_heads=2", "--gpus", "8"], "needs ffn="),
    (["--model-shape", "layers=2,hidden=64,heads=4,vocab=512,kv_heads=2,ffn=176,gated=false", "--gpus", "8"],
     "drop gated=false"),
])
def test_cli_errors_say_what_is_wrong(capsys, args, message):
    rc, out = _plan(capsys, *args)
    assert rc == 2 and message in out.err, out.err


def test_write_strategy_round_trips_through_the_trainer(tmp_path, capsys):
    from sampan.runfile import RunConfig
    from sampan.trainer.fleet_backend import strategy_for

    for extra in ([], ["--fix", "dp=2,mp=4,pp=8,micro_batch=1,recompute=full,vpp=2"]):
        path = tmp_path / "run.toml"
        rc, _ = _plan(capsys, "--model", "gpt-175b", "--gpus", "64", "--hardware", "h200", "--global-batch", "256",
                      "--write-strategy", str(path), *extra)
        assert rc == 0 and path.is_file()
        config = RunConfig.from_file(path)
        strategy = strategy_for(config.training)
        degrees = strategy.resolve_degrees(64)
        strategy.validate_for_model(96, 96, config.model.overrides["vocab_size"], degrees)
        assert config.model.name == "gpt-175b" and config.data.seq_len == 2048
        pipe = strategy.pipeline_configs
        data_ranks = degrees["dp"] * degrees["sharding"]
        assert pipe.accumulate_steps * config.training.per_device_train_batch_size * data_ranks == 256
        if extra:
            assert degrees == {"dp": 2, "sharding": 1, "pp": 8, "cp": 1, "mp": 4}
            assert (pipe.schedule_mode, pipe.virtual_pp_degree, strategy.recompute) == ("Interleaved1F1B", 2, "full")


@pytest.mark.parametrize("name", ["gpt-tiny", "ernie-tiny", "qwen3-tiny"])
def test_a_save_pretrained_config_file_plans_like_the_name(tmp_path, name):
    """``--model path/config.json`` as save_pretrained writes it (with its ``architecture`` key)."""
    import dataclasses

    from sampan.models import create

    create(name).save_pretrained(tmp_path / name)
    shape = load_model(str(tmp_path / name / "config.json"))
    assert shape.name == name  # named by its directory
    assert dataclasses.replace(shape, name=name) == load_model(name)


# --- the Llama family: Hugging Face config files, run files ------------------------------------
# Qwen2.5-7B's config.json as transformers writes it (Qwen/Qwen2.5-7B on the Hugging Face hub).
QWEN25_7B_HF = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 18944,
    "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
}


def _hf_file(tmp_path: Path, hf: dict, directory: str) -> Path:
    path = tmp_path / directory / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(hf, indent=2))
    return path


def test_a_hugging_face_qwen2_config_json_plans_like_the_name(tmp_path, capsys):
    import dataclasses

    path = _hf_file(tmp_path, QWEN25_7B_HF, "Qwen2.5-7B")
    shape = load_model(str(path))
    assert shape.name == "Qwen2.5-7B" and shape.registered is None
    # The registry's qwen2.5-7b is the instruct model's config (32K positions); RoPE has no table to count.
    assert dataclasses.replace(shape, name="qwen2.5-7b", max_positions=32768) == load_model("qwen2.5-7b")
    assert shape.num_parameters == 7_615_616_512 and (shape.kv_heads, shape.qkv_bias, shape.out_bias) == (4, True, False)
    rc, out = _plan(capsys, "--model", str(path), "--gpus", "8", "--hardware", "h100-80g", "--seq-len", "4096",
                    "--global-batch", "64", "--top", "3", "--json")
    assert rc == 0
    data = json.loads(out.out)
    assert data["model"]["family"] == "llama" and data["model"]["kv_heads"] == 4 and data["model"]["gated_mlp"]
    assert all(row["mp"] in (1, 2, 4) for row in data["rows"]) and len(data["rows"]) == 3


@pytest.mark.parametrize("name", ["gpt-small", "ernie-base"])
def test_hugging_face_gpt2_and_bert_configs_plan_like_the_zoo(tmp_path, name):
    """A config.json as transformers writes it for GPT-2 / BERT plans as the registered shape."""
    import sampan.models.ernie.hf as ernie_hf
    import sampan.models.gpt.hf as gpt_hf

    config = get_config(name)
    adapter = gpt_hf if config.model_type == "gpt" else ernie_hf
    head = "causal_lm" if config.model_type == "gpt" else "masked_lm"
    path = _hf_file(tmp_path, adapter.config_to_hf(config, head), name)
    shape = load_model(str(path))
    assert shape.num_parameters == load_model(name).num_parameters
    assert shape.flops_per_token(2048) == config.flops_per_token(2048)


def _planned_model(run_file: Path) -> tuple[dict, ModelShape]:
    """The run file's [model] table, and the shape of the model `sampan train` would build from it."""
    from sampan.runfile import RunConfig

    table = RunConfig.from_file(run_file).model.table()
    config = get_config(table["name"], **{k: v for k, v in table.items() if k != "name"})
    return table, shape_from_config("run", config)


@pytest.mark.parametrize("source", ["name", "hf-file", "inline"])
def test_write_strategy_of_a_llama_model_trains_that_model(tmp_path, capsys, source):
    import dataclasses

    args = {"name": ["--model", "llama3-8b"],
            "hf-file": ["--model", str(_hf_file(tmp_path, QWEN25_7B_HF, "Qwen2.5-7B"))],
            "inline": ["--model-shape", "layers=32,hidden=4096,heads=32,kv_heads=8,head_dim=128,vocab=128000,"
                       "ffn=14336"]}[source]
    path = tmp_path / "run.toml"
    rc, _ = _plan(capsys, *args, "--gpus", "16", "--hardware", "h100-80g", "--seq-len", "4096", "--global-batch", "64",
                  "--fix", "mp=4,pp=2,micro_batch=1", "--write-strategy", str(path))
    assert rc == 0
    table, built = _planned_model(path)
    planned = load_model(*args[1:]) if source != "inline" else load_model(shape=args[1])
    assert table["name"] == {"name": "llama3-8b", "hf-file": "qwen2.5-7b", "inline": "llama2-7b"}[source]
    assert built.family == "llama" and built.num_parameters == dataclasses.replace(planned, name="run").num_parameters
    expected = dataclasses.replace(planned, name="run", max_positions=max(4096, planned.max_positions))
    assert dataclasses.replace(built, max_positions=expected.max_positions) == expected


def test_stage_layers_follow_fleets_split():
    """The planner's layers per pipeline rank are the ones fleet gives it (uneven splits included)."""
    from sampan.distributed.pipeline import layer_ranges
    from sampan.planner.memory import stage_layers

    for layers in (7, 33, 96, 126):
        model = dataclasses.replace(load_model("llama3-405b"), layers=layers)
        for pp in (1, 2, 3, 4, 16):
            for vpp in (1, 2, 3):
                if pp * vpp > layers or (vpp > 1 and pp == 1):
                    continue
                ranges = layer_ranges(layers, pp * vpp)
                layout = Layout(pp=pp, vpp=vpp, schedule="Interleaved1F1B" if vpp > 1 else "1F1B")
                for stage in range(pp):
                    want = sum(end - start for start, end in ranges[stage::pp])
                    assert stage_layers(model, layout, stage) == want, (layers, pp, vpp, stage)


def test_in_flight_states_follow_torchs_interleaved_schedule():
    """Micro-batches in flight per chunk after each forward, against the op list torch's
    ScheduleInterleaved1F1B builds for every rank (warm-up, 1F1B, cool-down; depth first); and a
    chunk's gradients accumulate from its first backward to its last, then are reduced."""
    from types import SimpleNamespace

    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B, _ComputationType

    from sampan.planner.memory import in_flight_states

    for p in (2, 4, 8, 16):
        for v in (2, 3):
            for m in sorted({p, 2 * p, 4 * p}):
                rounds = max(1, m // p)
                fake = SimpleNamespace(n_local_stages=v, pp_group_size=p, microbatches_per_round=m // rounds,
                                       _n_microbatches=m)
                for rank in range(p):
                    counts, states = [0] * v, set()
                    for action in ScheduleInterleaved1F1B._calculate_single_rank_operations(fake, rank):
                        if action is None:
                            continue
                        if action.computation_type == _ComputationType.FORWARD:
                            counts[action.stage_index // p] += 1
                            states.add(tuple(counts))
                        else:
                            counts[action.stage_index // p] -= 1
                    after_forwards = {counts for when, counts, _ in in_flight_states(p, v, m, rank, "Interleaved1F1B")
                                      if when == 0}
                    assert after_forwards == states, (p, v, m, rank)


def test_a_chunks_gradients_live_from_its_first_backward_to_its_last():
    from sampan.planner.memory import in_flight_states

    # 1F1B, 4 micro-batches on rank 0 of 2 stages: F F B F B F B B; gradients from the first B on,
    # reduced after the fourth.
    states = in_flight_states(2, 1, 4, 0, "1F1B")
    assert (0, (2,), (0,)) in states and (1, (2,), (0,)) in states  # the warm-up peak, no gradients yet
    assert (0, (2,), (1,)) in states  # a forward beside the accumulated gradients: the steady-state peak
    assert all(phases != (2,) for _, _, phases in states)  # reduced only after the last backward starts
    gpipe = in_flight_states(2, 1, 3, 0, "GPipe")
    assert max(counts[0] for _, counts, phases in gpipe if phases == (1,)) == 2  # one backward done

"""``sampan plan`` answers without importing torch (importing it costs 7-13 s on a loaded machine).

Behaviour, not timing: a fresh interpreter runs the plan verb and then reports whether ``torch``
(or anything of sampan that needs it) was imported. The shapes come from the families' torch-free
configs (``sampan.models.registry``) and must equal them exactly; the torch-free pieces that stand
in for torch-importing ones (the strategy's mode names) are checked against the real ones.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sampan.models.registry import FAMILIES, get_config, list_models
from sampan.planner import layout as planner_layout
from sampan.planner.model_shape import load_model

PROBE = """
import contextlib, io, json, sys
from sampan.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")),
                  "printed": len(out.getvalue())}))
"""

PLAN_175B = ["plan", "--model", "gpt-175b", "--gpus", "1024", "--gpus-per-node", "8", "--gpu-memory-gb", "80",
             "--gpu-tflops", "312", "--intra-node-gbps", "600", "--inter-node-gbps", "200", "--seq-len", "2048",
             "--global-batch", "1536"]


def _probe(*argv: str) -> dict:
    run = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("extra", [[], ["--json", "--top", "3"],
                                   ["--fix", "mp=8,pp=8,sharding=16,micro_batch=1,recompute=full,vpp=2"]])
def test_plan_for_175b_does_not_import_torch(extra):
    result = _probe(*PLAN_175B, *extra)
    assert result["rc"] == 0 and result["printed"] > 500
    assert result["torch"] == [], f"the plan path imported {result['torch'][:5]}"


def test_an_inline_shape_does_not_import_torch():
    # (--write-strategy does: it builds the DistributedStrategy that `sampan train` will read, to validate it.)
    result = _probe("plan", "--model-shape", "layers=40,hidden=5120,heads=40,vocab=51200", "--gpus", "64",
                    "--global-batch", "256", "--top", "2")
    assert result["rc"] == 0 and result["torch"] == []


def test_the_other_verbs_still_parse():
    """The plan-only parser is a shortcut for `plan`; every other verb gets the full parser."""
    run = subprocess.run([sys.executable, "-m", "sampan.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0
    for verb in ("train", "report", "models", "launch", "plan", "bench", "demo"):
        assert verb in run.stdout


@pytest.mark.parametrize("argv", [
    ["--model", "qwen2.5-7b", "--gpus", "8", "--hardware", "h100-80g", "--seq-len", "4096", "--global-batch", "64"],
    ["--model", "llama3-405b", "--gpus", "8192", "--hardware", "h100-80g", "--seq-len", "8192", "--global-batch",
     "2048", "--fix", "mp=8,pp=16"],
    ["--model-shape", "layers=32,hidden=4096,heads=32,kv_heads=8,vocab=128256,ffn=14336", "--gpus", "16",
     "--global-batch", "64", "--top", "2", "--json"],
])
def test_a_llama_family_plan_does_not_import_torch(argv):
    result = _probe("plan", *argv)
    assert result["rc"] == 0 and result["printed"] > 500
    assert result["torch"] == [], f"the plan path imported {result['torch'][:5]}"


def test_a_hugging_face_config_json_does_not_import_torch(tmp_path):
    """A Qwen3 config.json (read through the Llama family's torch-free adapter)."""
    hf = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
          "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
          "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
          "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False,
          "torch_dtype": "bfloat16", "transformers_version": "4.51.0"}
    path = tmp_path / "Qwen3-0.6B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(hf))
    result = _probe("plan", "--model", str(path), "--gpus", "8", "--global-batch", "64", "--top", "2")
    assert result["rc"] == 0 and result["printed"] > 500 and result["torch"] == []
    assert load_model(str(path)).num_parameters == get_config("qwen3-0.6b").num_parameters()


def test_the_hugging_face_adapters_import_no_torch():
    """The planner reads HF config.json files through the families' adapters."""
    for module in sorted(spec.hf for spec in FAMILIES.values() if spec.hf):
        probe = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
        run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.strip() == "[]", (module, run.stdout[-500:], run.stderr[-500:])


@pytest.mark.parametrize("name", list_models())
def test_every_registered_shape_equals_its_config(name):
    """Parameters and FLOPs per token exactly as the family's closed forms (checked against transformers)."""
    shape, config = load_model(name), get_config(name)
    assert shape.family == config.model_type and shape.registered == name
    assert shape.num_parameters == config.num_parameters()
    for seq_len in (1, 128, 2048, 4096, 8192):
        assert shape.flops_per_token(seq_len) == config.flops_per_token(seq_len), seq_len
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn, shape.vocab) == (
        config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
        config.intermediate_size, config.vocab_size)
    if config.model_type != "ernie":  # the blocks, embeddings and final norm are all there is
        assert shape.extra_params == 0
    if config.model_type == "llama":
        assert shape.gated_mlp and shape.norm == "rmsnorm" and shape.learned_positions == 0
        assert (shape.qkv_bias, shape.out_bias, shape.mlp_bias, shape.qk_norm) == (
            config.qkv_bias, config.out_bias, config.mlp_bias, config.qk_norm)


def test_mode_names_equal_the_strategys():
    from sampan.distributed import strategy

    assert planner_layout.SCHEDULE_MODES == strategy.SCHEDULE_MODES
    assert planner_layout.RECOMPUTE_MODES == strategy.RECOMPUTE_MODES


def test_the_tensor_front_door_still_works():
    import sampan

    x = sampan.randn([2, 3])
    assert tuple(x.shape) == (2, 3) and sampan.no_grad is sampan.tensor.no_grad
    from sampan import arange, zeros

    assert arange(3).tolist() == [0, 1, 2] and zeros([1]).tolist() == [0.0]

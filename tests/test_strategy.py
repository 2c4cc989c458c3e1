"""DistributedStrategy: Paddle-style dict configuration, validation, degree resolution, model checks."""

from __future__ import annotations

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from sampan.distributed.strategy import (
    DistributedStrategy,
    HybridConfig,
    PipelineConfig,
    ShardingConfig,
    TensorParallelConfig,
)


def test_paddle_style_hybrid_configs():
    strategy = DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 2, "mp_degree": 2, "pp_degree": 2}
    cfg = strategy.hybrid_configs
    assert isinstance(cfg, HybridConfig)
    assert cfg["mp_degree"] == 2 and cfg.pp_degree == 2
    assert dict(cfg) == {"dp_degree": 2, "mp_degree": 2, "pp_degree": 2, "sharding_degree": 1, "cp_degree": 1,
                         "ep_degree": 1}
    assert cfg.to_dict() == dict(cfg)
    assert "dp_degree" in cfg


def test_partial_update_keeps_other_values():
    strategy = DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 2, "mp_degree": 4}
    strategy.hybrid_configs = {"pp_degree": 3}
    assert dict(strategy.hybrid_configs) == {"dp_degree": 2, "mp_degree": 4, "pp_degree": 3, "sharding_degree": 1,
                                             "cp_degree": 1, "ep_degree": 1}
    strategy.pipeline_configs = {"accumulate_steps": 8}
    strategy.pipeline_configs = {"micro_batch_size": 2}
    assert strategy.pipeline_configs.accumulate_steps == 8
    assert strategy.pipeline_configs.micro_batch_size == 2


def test_setter_takes_a_dataclass():
    strategy = DistributedStrategy()
    strategy.sharding_configs = ShardingConfig(stage=3)
    strategy.tensor_parallel_configs = TensorParallelConfig(sequence_parallel=True)
    assert strategy.sharding_configs["stage"] == 3
    assert strategy.tensor_parallel_configs.sequence_parallel is True
    with pytest.raises(TypeError, match="takes a dict or a HybridConfig"):
        strategy.hybrid_configs = [("dp_degree", 2)]


def test_unknown_key_is_an_error_naming_it():
    strategy = DistributedStrategy()
    with pytest.raises(ValueError, match="tp_degree") as info:
        strategy.hybrid_configs = {"dp_degree": 2, "tp_degree": 2}
    assert "allowed" in str(info.value) and "mp_degree" in str(info.value)
    assert strategy.hybrid_configs.dp_degree == 1  # a rejected update changes nothing
    with pytest.raises(ValueError, match="sharding_degree"):
        strategy.sharding_configs = {"sharding_degree": 2}
    with pytest.raises(KeyError, match="dp"):
        strategy.hybrid_configs["dp"]


def test_sections_cannot_be_changed_past_validation():
    strategy = DistributedStrategy()
    with pytest.raises(TypeError, match="strategy.hybrid_configs = "):
        strategy.hybrid_configs["dp_degree"] = 0
    with pytest.raises(AttributeError):
        strategy.hybrid_configs.dp_degree = 0


@pytest.mark.parametrize(
    "section, values, words",
    [
        ("hybrid_configs", {"dp_degree": 0}, ["dp_degree", ">= 1 or -1"]),
        ("hybrid_configs", {"mp_degree": 2.0}, ["mp_degree"]),
        ("hybrid_configs", {"pp_degree": True}, ["pp_degree"]),
        ("hybrid_configs", {"dp_degree": -1, "mp_degree": -1}, ["at most one", "dp_degree", "mp_degree"]),
        ("sharding_configs", {"stage": 4}, ["stage", "[1, 2, 3]"]),
        ("sharding_configs", {"stage": True}, ["stage"]),
        ("pipeline_configs", {"accumulate_steps": 0}, ["accumulate_steps"]),
        ("pipeline_configs", {"micro_batch_size": -1}, ["micro_batch_size"]),
        ("pipeline_configs", {"schedule_mode": "ZB"}, ["schedule_mode", "1F1B", "Interleaved1F1B", "GPipe"]),
        ("tensor_parallel_configs", {"sequence_parallel": 1}, ["sequence_parallel"]),
    ],
)
def test_invalid_values(section, values, words):
    strategy = DistributedStrategy()
    with pytest.raises(ValueError) as info:
        setattr(strategy, section, values)
    for word in words:
        assert word in str(info.value)


def test_schedule_mode_alias_and_interleaved_rules():
    assert PipelineConfig(schedule_mode="FThenB").schedule_mode == "GPipe"
    strategy = DistributedStrategy()
    strategy.pipeline_configs = {"schedule_mode": "FThenB"}
    assert strategy.pipeline_configs["schedule_mode"] == "GPipe"
    strategy.pipeline_configs = {"schedule_mode": "Interleaved1F1B", "virtual_pp_degree": 2}
    assert strategy.pipeline_configs.virtual_pp_degree == 2
    with pytest.raises(ValueError, match="Interleaved1F1B' needs virtual_pp_degree >= 2"):
        PipelineConfig(schedule_mode="Interleaved1F1B")
    with pytest.raises(ValueError, match="virtual_pp_degree=2 needs schedule_mode 'Interleaved1F1B'"):
        PipelineConfig(virtual_pp_degree=2)
    with pytest.raises(ValueError, match="virtual_pp_degree=2 needs"):
        strategy.pipeline_configs = {"schedule_mode": "1F1B"}  # the kept virtual_pp_degree=2 conflicts


def test_recompute_and_amp_coercions():
    strategy = DistributedStrategy()
    assert strategy.recompute == "none" and strategy.amp is None
    strategy.recompute = True
    assert strategy.recompute == "full"
    strategy.recompute = False
    assert strategy.recompute == "none"
    strategy.recompute = "selective"
    assert strategy.recompute == "selective"
    strategy.amp = True
    assert strategy.amp == "bf16"
    strategy.amp = False
    assert strategy.amp is None
    strategy.amp = "fp16"
    assert strategy.amp == "fp16"
    with pytest.raises(ValueError, match="recompute must be one of"):
        strategy.recompute = "partial"
    with pytest.raises(ValueError, match="amp must be one of"):
        strategy.amp = "fp8"


def test_sharding_flag_is_derived():
    strategy = DistributedStrategy()
    assert strategy.sharding is False
    strategy.sharding = False  # agrees: fine
    with pytest.raises(ValueError, match="sharding_degree"):
        strategy.sharding = True
    strategy.hybrid_configs = {"sharding_degree": 4}
    assert strategy.sharding is True
    strategy.sharding = True


def test_resolve_leftover_degree():
    strategy = DistributedStrategy(hybrid_configs={"dp_degree": -1, "mp_degree": 2, "pp_degree": 2})
    assert strategy.resolve_degrees(8) == {"dp": 2, "sharding": 1, "pp": 2, "cp": 1, "mp": 2}
    assert strategy.resolve_degrees(16)["dp"] == 4
    strategy.hybrid_configs = {"dp_degree": 1, "sharding_degree": -1}
    assert strategy.resolve_degrees(16)["sharding"] == 4
    assert DistributedStrategy().resolve_degrees(1) == {"dp": 1, "sharding": 1, "pp": 1, "cp": 1, "mp": 1}
    strategy.hybrid_configs = {"sharding_degree": 2, "cp_degree": -1}
    assert strategy.resolve_degrees(32) == {"dp": 1, "sharding": 2, "pp": 2, "cp": 4, "mp": 2}


def test_resolve_errors():
    strategy = DistributedStrategy(hybrid_configs={"dp_degree": 2, "mp_degree": 2})
    with pytest.raises(ValueError) as info:
        strategy.resolve_degrees(8)
    text = str(info.value)
    assert "dp_degree=2" in text and "mp_degree=2" in text  # the degrees
    assert "= 4" in text and "world_size is 8" in text  # their product and the world size
    assert "set dp_degree=-1 to take the leftover ranks" in text  # the fix
    strategy.hybrid_configs = {"dp_degree": -1, "mp_degree": 3}
    with pytest.raises(ValueError, match="do not divide world_size 8"):
        strategy.resolve_degrees(8)
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="world_size must be an integer >= 1"):
            strategy.resolve_degrees(bad)


def test_validate_for_model_accepts_a_good_layout():
    strategy = DistributedStrategy(hybrid_configs={"dp_degree": -1, "mp_degree": 2, "pp_degree": 2},
                                   pipeline_configs={"accumulate_steps": 4},
                                   tensor_parallel_configs={"sequence_parallel": True})
    degrees = strategy.resolve_degrees(8)
    strategy.validate_for_model(num_heads=8, num_layers=4, vocab_size=50304, degrees=degrees)
    # sequence_parallel at mp 1 is a no-op, not an error
    DistributedStrategy(tensor_parallel_configs={"sequence_parallel": True}).validate_for_model(
        num_heads=3, num_layers=1, vocab_size=7, degrees={"dp": 1, "sharding": 1, "pp": 1, "mp": 1})


def test_validate_for_model_errors():
    strategy = DistributedStrategy()
    degrees = {"dp": 1, "sharding": 1, "pp": 1, "mp": 3}
    with pytest.raises(ValueError) as info:
        strategy.validate_for_model(num_heads=8, num_layers=2, vocab_size=1000, degrees=degrees)
    text = str(info.value)
    assert "mp_degree 3 does not divide the model's 8 attention heads; use one of [1, 2, 4, 8]" in text
    assert "vocabulary-parallel embedding" in text and "pad the vocabulary to a multiple of 3" in text
    assert "vocab_size=1002" in text

    with pytest.raises(ValueError, match="num_layers 3 is fewer than pp_degree 4"):
        DistributedStrategy(pipeline_configs={"accumulate_steps": 4}).validate_for_model(
            num_heads=8, num_layers=3, vocab_size=1000, degrees={"pp": 4})
    interleaved = DistributedStrategy(
        pipeline_configs={"accumulate_steps": 4, "schedule_mode": "Interleaved1F1B", "virtual_pp_degree": 2})
    with pytest.raises(ValueError, match="virtual_pp_degree 2 = 8 pipeline chunks"):
        interleaved.validate_for_model(num_heads=8, num_layers=6, vocab_size=1000, degrees={"pp": 4})
    interleaved.validate_for_model(num_heads=8, num_layers=8, vocab_size=1000, degrees={"pp": 4})

    with pytest.raises(ValueError, match="micro-batches fewer than pipeline stages") as info:
        DistributedStrategy(pipeline_configs={"accumulate_steps": 2}).validate_for_model(
            num_heads=8, num_layers=8, vocab_size=1000, degrees={"pp": 4})
    assert "set accumulate_steps >= 4" in str(info.value)


def test_ep_degree_is_carved_out_of_the_data_ranks():
    strategy = DistributedStrategy(hybrid_configs={"dp_degree": 2, "sharding_degree": 2, "mp_degree": 2,
                                                   "ep_degree": 4})
    assert strategy.resolve_degrees(8) == {"dp": 2, "sharding": 2, "pp": 1, "cp": 1, "mp": 2}  # no new axis
    strategy.validate_for_model(num_heads=4, num_layers=2, vocab_size=64, degrees=strategy.resolve_degrees(8),
                                num_experts=8)
    with pytest.raises(ValueError, match="ep_degree 4 does not divide the data ranks dp_degree 2 x sharding_degree 1"):
        DistributedStrategy(hybrid_configs={"dp_degree": -1, "mp_degree": 4, "ep_degree": 4}).resolve_degrees(8)
    with pytest.raises(ValueError, match="must be an integer >= 1, got -1"):
        DistributedStrategy(hybrid_configs={"ep_degree": -1})  # it adds no ranks, so there are none left over
    with pytest.raises(ValueError) as info:
        strategy.validate_for_model(num_heads=4, num_layers=2, vocab_size=64, degrees={"dp": 2, "sharding": 2},
                                    num_experts=6)
    assert "ep_degree 4 does not divide the model's 6 experts" in str(info.value)
    assert "use one of [1, 2]" in str(info.value)
    with pytest.raises(ValueError, match="but this model is dense"):
        strategy.validate_for_model(num_heads=4, num_layers=2, vocab_size=64, degrees={"dp": 4})
    with pytest.raises(ValueError, match="ep_degree 4 does not divide the data ranks dp x sharding = 2"):
        strategy.validate_for_model(num_heads=4, num_layers=2, vocab_size=64, degrees={"dp": 2}, num_experts=8)


def test_validate_for_model_rejects_bad_degrees():
    strategy = DistributedStrategy()
    with pytest.raises(ValueError, match="unknown degree key"):
        strategy.validate_for_model(num_heads=8, num_layers=2, vocab_size=8, degrees={"tp": 2})
    with pytest.raises(ValueError, match="resolve_degrees first"):
        strategy.validate_for_model(num_heads=8, num_layers=2, vocab_size=8, degrees={"dp": -1})
    with pytest.raises(ValueError, match="num_heads must be"):
        strategy.validate_for_model(num_heads=0, num_layers=2, vocab_size=8, degrees={})


def test_to_dict_from_dict_round_trip():
    strategy = DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": -1, "mp_degree": 2, "pp_degree": 2, "sharding_degree": 2}
    strategy.sharding_configs = {"stage": 2}
    strategy.pipeline_configs = {"accumulate_steps": 8, "schedule_mode": "Interleaved1F1B", "virtual_pp_degree": 2}
    strategy.tensor_parallel_configs = {"sequence_parallel": True}
    strategy.recompute = "selective"
    strategy.amp = "bf16"
    data = strategy.to_dict()
    assert data["hybrid_configs"] == {"dp_degree": -1, "mp_degree": 2, "pp_degree": 2, "sharding_degree": 2,
                                      "cp_degree": 1, "ep_degree": 1}
    assert data["amp_configs"] == {"level": "O1", "use_master_weight": True, "use_master_grad": True}
    assert data["amp"] == "bf16" and data["recompute"] == "selective"
    again = DistributedStrategy.from_dict(data)
    assert again == strategy and again.to_dict() == data
    assert DistributedStrategy.from_dict(DistributedStrategy().to_dict()) == DistributedStrategy()
    assert "amp" not in DistributedStrategy().to_dict()  # TOML has no null


def test_from_dict_reads_a_toml_table():
    raw = tomllib.loads("""
[strategy]
recompute = "full"
[strategy.hybrid_configs]
dp_degree = -1
mp_degree = 2
[strategy.pipeline_configs]
schedule_mode = "FThenB"
""")
    strategy = DistributedStrategy.from_dict(raw["strategy"])
    assert strategy.recompute == "full"
    assert strategy.hybrid_configs["mp_degree"] == 2 and strategy.hybrid_configs.pp_degree == 1
    assert strategy.pipeline_configs.schedule_mode == "GPipe"


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ValueError, match="'gradient_clip_norm'") as info:
        DistributedStrategy.from_dict({"recompute": "full", "gradient_clip_norm": 1.0})
    assert "allowed" in str(info.value) and "hybrid_configs" in str(info.value)
    with pytest.raises(ValueError, match="'sep_degree'"):
        DistributedStrategy.from_dict({"hybrid_configs": {"sep_degree": 2}})


def test_repr_is_readable():
    strategy = DistributedStrategy(hybrid_configs={"mp_degree": 2}, amp="bf16")
    text = repr(strategy)
    assert text.startswith("DistributedStrategy(")
    assert "HybridConfig(dp_degree=1, mp_degree=2, pp_degree=1, sharding_degree=1, cp_degree=1, ep_degree=1)" in text
    assert "AmpConfig(level='O1'" in text
    assert "amp='bf16'" in text and "recompute='none'" in text


def test_amp_configs_o2_is_checked_against_amp():
    strategy = DistributedStrategy(amp_configs={"level": "O2"})
    assert strategy.amp_configs.use_master_weight and strategy.amp_configs.use_master_grad
    with pytest.raises(ValueError, match="needs strategy.amp = 'bf16'"):
        strategy.check_precision()
    strategy.amp = "bf16"
    assert strategy.pure_bf16
    strategy.amp_configs = {"level": "O1"}
    assert not strategy.pure_bf16
    for bad, words in (({"level": "O3"}, ["level", "O1", "O2"]), ({"use_master_grad": 1}, ["use_master_grad"]),
                       ({"use_pure_bf16": True}, ["use_pure_bf16", "allowed"])):
        with pytest.raises(ValueError) as info:
            strategy.amp_configs = bad
        assert all(w in str(info.value) for w in words), str(info.value)

"""save_pretrained / from_pretrained: bit-for-bit round trips, tied weights, atomic replace, errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

import sampan
from sampan.models import (
    ErnieForMaskedLM,
    ErnieForSequenceClassification,
    ErnieForTokenClassification,
    ErnieModel,
    GPTForCausalLM,
    GPTModel,
    PretrainedModel,
    create,
    from_pretrained,
)
from sampan.models.pretrained import CONFIG_NAME, WEIGHTS_NAME

ERNIE_SMALL = {"vocab_size": 200, "hidden_size": 32, "num_layers": 2, "num_heads": 2,
               "max_position_embeddings": 32, "num_labels": 3, "pinyin_vocab_size": 7}
GPT_SMALL = {"vocab_size": 200, "num_layers": 2, "max_position_embeddings": 32}


def gpt(seed=0, **overrides):
    torch.manual_seed(seed)
    return create("gpt-tiny", **{**GPT_SMALL, **overrides})


def ernie(head, seed=0, **overrides):
    torch.manual_seed(seed)
    return create("ernie-tiny", head=head, **{**ERNIE_SMALL, **overrides})


def saved_keys(directory) -> set[str]:
    with safe_open(str(directory / WEIGHTS_NAME), framework="pt") as f:
        return set(f.keys())


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name in sa:
        assert (name, sa[name].dtype) == (name, sb[name].dtype)
        assert torch.equal(sa[name], sb[name]), name


IDS = torch.tensor([[5, 9, 11, 3, 0, 0], [17, 2, 8, 8, 1, 4]])


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_round_trip_bit_for_bit(tmp_path, tie):
    model = gpt(tie_word_embeddings=tie).eval()
    path = model.save_pretrained(tmp_path / "gpt")
    assert path == tmp_path / "gpt"
    assert sorted(p.name for p in path.iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME])
    loaded = GPTForCausalLM.from_pretrained(path)
    assert type(loaded) is GPTForCausalLM and not loaded.training
    assert loaded.config == model.config
    assert_same_state(model, loaded)
    assert torch.equal(loaded(IDS), model(IDS))
    assert torch.equal(loaded.generate(IDS, max_new_tokens=5), model.generate(IDS, max_new_tokens=5))
    if tie:
        assert loaded.lm_head.weight is loaded.gpt.embeddings.word_embeddings.weight
        # The tied tensor is stored once.
        assert saved_keys(path) == set(model.state_dict()) - {"lm_head.weight"}
    else:
        assert loaded.lm_head.weight is not loaded.gpt.embeddings.word_embeddings.weight
        assert saved_keys(path) == set(model.state_dict())


def test_tied_weights_stay_tied_after_training_a_loaded_model(tmp_path):
    gpt().save_pretrained(tmp_path / "m")
    loaded = from_pretrained(tmp_path / "m")
    opt = sampan.optimizer.SGD(learning_rate=0.5, parameters=loaded.parameters())
    loaded(IDS, labels=IDS).backward()
    opt.step()
    assert loaded.lm_head.weight is loaded.gpt.embeddings.word_embeddings.weight
    assert loaded.num_parameters() == loaded.config.num_parameters()


@pytest.mark.parametrize("head, cls", [
    ("masked_lm", ErnieForMaskedLM),
    ("none", ErnieModel),
    ("sequence_classification", ErnieForSequenceClassification),
    ("token_classification", ErnieForTokenClassification),
])
def test_ernie_round_trip_every_head(tmp_path, head, cls):
    model = ernie(head).eval()
    # Make the zero-initialised tensors non-trivial so the check is meaningful.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(tmp_path / head)
    loaded = sampan.models.from_pretrained(tmp_path / head)
    assert type(loaded) is cls
    assert loaded.config == model.config
    assert_same_state(model, loaded)
    pinyin = torch.randint(0, 7, IDS.shape, generator=torch.Generator().manual_seed(0))
    out, ref = loaded(IDS, pinyin_ids=pinyin), model(IDS, pinyin_ids=pinyin)
    if head == "none":
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
    else:
        assert torch.equal(out, ref)
    if head == "masked_lm":
        assert loaded.lm_head.decoder.weight is loaded.ernie.embeddings.word_embeddings.weight
        assert "lm_head.decoder.weight" not in saved_keys(tmp_path / head)
        assert saved_keys(tmp_path / head) == set(model.state_dict()) - {"lm_head.decoder.weight"}
    else:
        assert saved_keys(tmp_path / head) == set(model.state_dict())


def test_config_json_contents(tmp_path):
    model = ernie("sequence_classification")
    model.save_pretrained(tmp_path / "e")
    data = json.loads((tmp_path / "e" / CONFIG_NAME).read_text(encoding="utf-8"))
    assert data["architecture"] == "ErnieForSequenceClassification"
    assert data["model_type"] == "ernie"
    assert data["hidden_size"] == 32 and data["num_labels"] == 3


def test_base_class_and_function_dispatch(tmp_path):
    gpt().save_pretrained(tmp_path / "g")
    assert type(PretrainedModel.from_pretrained(tmp_path / "g")) is GPTForCausalLM
    assert type(from_pretrained(str(tmp_path / "g"))) is GPTForCausalLM


def test_bf16_round_trip_keeps_dtype(tmp_path):
    torch.manual_seed(0)
    model = create("gpt-tiny", dtype="bfloat16", **GPT_SMALL)
    model.save_pretrained(tmp_path / "bf16")
    with safe_open(str(tmp_path / "bf16" / WEIGHTS_NAME), framework="pt") as f:
        assert f.get_tensor("gpt.norm.weight").dtype == torch.bfloat16
    loaded = from_pretrained(tmp_path / "bf16")
    assert_same_state(model, loaded)  # same values *and* dtypes


def test_missing_config_is_file_not_found(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        from_pretrained(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="config.json"):
        GPTForCausalLM.from_pretrained(tmp_path / "does-not-exist")


def test_missing_weights_is_file_not_found(tmp_path):
    gpt().save_pretrained(tmp_path / "m")
    (tmp_path / "m" / WEIGHTS_NAME).unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        from_pretrained(tmp_path / "m")


def edit_config(directory, **changes):
    path = directory / CONFIG_NAME
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_tampered_hidden_size_names_shapes(tmp_path):
    gpt().save_pretrained(tmp_path / "m")
    edit_config(tmp_path / "m", hidden_size=64)
    with pytest.raises(ValueError, match=r"has shape \(\d+, 128\).*expects \(\d+, 64\)"):
        from_pretrained(tmp_path / "m")


def test_tampered_layer_count_names_keys(tmp_path):
    ernie("masked_lm").save_pretrained(tmp_path / "m")
    edit_config(tmp_path / "m", num_layers=1)
    with pytest.raises(ValueError, match=r"unexpected \['ernie\.layers\.1\."):
        from_pretrained(tmp_path / "m")
    edit_config(tmp_path / "m", num_layers=3)
    with pytest.raises(ValueError, match=r"missing \['ernie\.layers\.2\."):
        from_pretrained(tmp_path / "m")


def test_unknown_config_field_is_value_error(tmp_path):
    gpt().save_pretrained(tmp_path / "m")
    edit_config(tmp_path / "m", rotary_base=10000)
    with pytest.raises(ValueError, match="rotary_base"):
        from_pretrained(tmp_path / "m")


def test_unknown_architecture_is_value_error(tmp_path):
    gpt().save_pretrained(tmp_path / "m")
    edit_config(tmp_path / "m", architecture="MambaForCausalLM")
    with pytest.raises(ValueError, match="MambaForCausalLM"):
        from_pretrained(tmp_path / "m")


def test_existing_directory_is_replaced_and_no_temp_left(tmp_path):
    target = tmp_path / "model"
    first = gpt(seed=1)
    first.save_pretrained(target)
    (target / "stale.txt").write_text("from an older save")
    second = gpt(seed=2, num_layers=1)
    second.save_pretrained(target)
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no temp or backup dirs left
    assert sorted(p.name for p in target.iterdir()) == sorted([CONFIG_NAME, WEIGHTS_NAME])
    loaded = from_pretrained(target)
    assert loaded.config.num_layers == 1
    assert_same_state(second, loaded)


def test_save_creates_parent_directories(tmp_path):
    target = tmp_path / "a" / "b" / "model"
    gpt().save_pretrained(target)
    assert (target / CONFIG_NAME).is_file() and (target / WEIGHTS_NAME).is_file()


def test_save_meta_model_is_value_error(tmp_path):
    model = create("gpt-tiny", device="meta", **GPT_SMALL)
    with pytest.raises(ValueError, match="meta"):
        model.save_pretrained(tmp_path / "meta")
    assert not (tmp_path / "meta").exists()
    assert list(tmp_path.iterdir()) == []


def test_wrong_class_is_type_error(tmp_path):
    ernie("masked_lm").save_pretrained(tmp_path / "ernie")
    with pytest.raises(TypeError, match="ErnieForMaskedLM"):
        GPTForCausalLM.from_pretrained(tmp_path / "ernie")
    gpt().save_pretrained(tmp_path / "gpt")
    with pytest.raises(TypeError, match="GPTModel"):
        GPTModel.from_pretrained(tmp_path / "gpt")
    with pytest.raises(TypeError):
        ErnieModel.from_pretrained(tmp_path / "gpt")


def test_pieces_fill_one_stacked_tensor_and_a_missing_piece_is_named():
    """A per-expert checkpoint fills a model's ``[experts, ...]`` tensor piece by piece."""
    from sampan.models.loading import load_tensors

    class Stacked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(3, 4, 2))

    pieces = [("w", torch.full((2, 2), float(e)), (e, slice(0, 2))) for e in range(3)]
    pieces += [("w", torch.full((2, 2), -1.0 - e), (e, slice(2, 4))) for e in range(3)]
    model = Stacked()
    assert load_tensors(model, pieces, "ckpt") == {"w"}
    assert torch.equal(model.w[1, :2], torch.ones(2, 2)) and torch.equal(model.w[2, 2:], torch.full((2, 2), -3.0))
    with pytest.raises(ValueError, match=r"missing \['w \(only 20/24 elements\)'\]"):
        load_tensors(Stacked(), pieces[:-1], "ckpt")
    with pytest.raises(ValueError, match="given twice, with different values"):
        load_tensors(Stacked(), [*pieces, ("w", torch.zeros(2, 2), (0, slice(2, 4)))], "ckpt")
    with pytest.raises(ValueError, match=r"piece of w at \(0, slice\(0, 3, None\)\) has shape"):
        load_tensors(Stacked(), [("w", torch.zeros(2, 2), (0, slice(0, 3)))], "ckpt")

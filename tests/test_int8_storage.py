"""Int8 row-wise weight storage (sampan.models.weight_files.quantize_file): the store's format for
large shipped models. Checks the rounding bound, that every loader reads the file back as ordinary
fp16 tensors, and what it costs the shipped ernie-tiny-zh on real text. Cost: ~4 s (two small ERNIE forwards)."""

from __future__ import annotations

import shutil

import pytest
import torch


def test_quantize_rounds_within_half_a_step_and_keeps_zero_rows():
    from sampan.models.weight_files import dequantize_int8, quantize_int8

    w = torch.randn(64, 48) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different scales
    w[5] = 0.0
    values, scale = quantize_int8(w)
    assert values.dtype == torch.int8 and scale.shape == (64, 1) and scale.dtype == torch.float16
    back = dequantize_int8(values, scale).float()
    assert torch.all((back - w).abs() <= scale.float() * 0.5 + w.abs() * 2e-3 + 1e-7)  # + fp16's own rounding
    assert torch.equal(back[5], torch.zeros(48))
    with pytest.raises(ValueError, match="2-D float"):
        quantize_int8(torch.ones(3))
    with pytest.raises(ValueError, match="int8 row-wise"):
        dequantize_int8(values.float(), scale)


def test_the_shipped_base_stored_in_int8_loads_everywhere_at_half_the_bytes(tmp_path):
    from sampan.finetune.base import load_base
    from sampan.models.pretrained import from_pretrained
    from sampan.models.weight_files import SAFETENSORS, quantize_file, tensor_names, weight_files
    from sampan.store.models import resolve
    from sampan.text.tokenizer import ChineseTokenizer

    src = resolve("ernie-tiny-zh")
    dst = tmp_path / "ernie-tiny-int8"
    shutil.copytree(src, dst)
    stats = quantize_file(dst / SAFETENSORS)
    assert stats["quantized"] > 10 and stats["bytes_after"] < 0.6 * stats["bytes_before"]
    with pytest.raises(ValueError, match="already"):
        quantize_file(dst / SAFETENSORS)
    assert tensor_names(weight_files(dst)) == tensor_names(weight_files(src))  # the scales stay hidden

    # Every character of two unseen sentences masked in turn: the int8 model's masked-LM loss is
    # within 1% of fp16's and it predicts nearly the same tokens.
    fp16, int8 = from_pretrained(src).float(), from_pretrained(dst).float()
    tok = ChineseTokenizer.load(src / "tokenizer.json")
    rows, labels = [], []
    for text in ("国务院总理主持召开常务会议，部署进一步做好稳就业工作。", "这家餐厅的服务非常棒，菜也很好吃。"):
        ids = tok.encode(text).ids
        for i in range(1, len(ids) - 1):
            row = list(ids)
            row[i] = tok.mask_id
            rows.append(torch.tensor(row))
            labels.append(torch.tensor([-100] * i + [ids[i]] + [-100] * (len(ids) - i - 1)))
    input_ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=tok.pad_id)
    label_ids = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=-100)
    mask = (input_ids != tok.pad_id).long()
    with torch.no_grad():
        logits16 = fp16(input_ids, attention_mask=mask)
        logits8 = int8(input_ids, attention_mask=mask)
    where = label_ids != -100
    ce = torch.nn.functional.cross_entropy
    loss16, loss8 = ce(logits16[where], label_ids[where]).item(), ce(logits8[where], label_ids[where]).item()
    assert abs(loss8 - loss16) < 0.01 * loss16, (loss16, loss8)
    agree = (logits16[where].argmax(-1) == logits8[where].argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree
    # the fine-tuning loader reads the same dequantized weights
    base = load_base(str(dst))
    reference = {k: v.float() for k, v in int8.state_dict().items()}
    checked = 0
    for name, tensor in base.weights.items():
        assert tensor.dtype == torch.float32
        if name in reference:
            assert torch.equal(tensor, reference[name]), name
            checked += 1
    assert checked >= 0.9 * len(base.weights), (checked, len(base.weights))


def test_a_recipe_marked_int8_stores_its_weights_int8(tmp_path, monkeypatch):
    """``Recipe.stored="int8"``: ``hub build`` rewrites whatever the recipe built before storing it."""
    import dataclasses

    from safetensors import safe_open

    from sampan.hub import recipes
    from sampan.models.weight_files import INT8_ROWWISE, QUANT_KEY, SAFETENSORS
    from sampan.store.models import resolve

    @dataclasses.dataclass
    class Nothing:
        pass

    def build(settings, out, log):
        for name in ("config.json", SAFETENSORS, "tokenizer.json"):
            shutil.copyfile(resolve("ernie-tiny-zh") / name, out / name)
        return {"copied": 1}

    monkeypatch.setitem(recipes.RECIPES, "tiny-int8", recipes.Recipe("tiny-int8", "fill_mask", "a copy", Nothing,
                                                                      build, stored="int8"))
    out = recipes.build("tiny-int8", out_root=tmp_path, log=lambda m: None)
    with safe_open(str(out / SAFETENSORS), framework="pt") as f:
        assert (f.metadata() or {}).get(QUANT_KEY) == INT8_ROWWISE
    assert (out / SAFETENSORS).stat().st_size < 0.6 * (resolve("ernie-tiny-zh") / SAFETENSORS).stat().st_size

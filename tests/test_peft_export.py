"""A sampan-trained Llama-family model, fine-tuned with LoRA, runs in transformers + peft unchanged."""

from __future__ import annotations

import json

import pytest
import torch

import sampan
from sampan.finetune import apply_lora, merge_lora, save_peft_adapter, without_lora

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
transformers.logging.set_verbosity_error()


def _train(model, steps: int, seed: int, lr: float = 1e-2) -> None:
    gen = torch.Generator().manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = sampan.optimizer.AdamW(learning_rate=lr, parameters=params)
    model.train()
    for _ in range(steps):
        ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=gen)
        optimizer.minimize(model(ids, labels=ids))
    model.eval()


@pytest.fixture(scope="module")
def fine_tuned(tmp_path_factory):
    torch.manual_seed(0)
    model = sampan.models.create("qwen2-tiny", vocab_size=128)
    _train(model, steps=5, seed=1)                        # pretrain a little in sampan
    for p in model.parameters():
        p.requires_grad_(False)
    names = apply_lora(model, ["q_proj", "v_proj", "down_proj"], rank=4, alpha=8, within="model.")
    _train(model, steps=5, seed=2)                        # then LoRA only
    out = tmp_path_factory.mktemp("peft")
    save_peft_adapter(model, out / "adapter", base_dir=out / "base")
    return model, names, out


def test_adapter_files_are_peft_format(fine_tuned):
    model, names, out = fine_tuned
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    assert sorted(config["target_modules"]) == sorted(names)  # the Llama family's names are HF's
    assert config["base_model_name_or_path"] == str((out / "base").resolve())
    # The base is saved without the update and without any lora_ tensors.
    base_config = json.loads((out / "base" / "config.json").read_text())
    assert base_config["model_type"] == "qwen2"
    assert "lora_A" not in " ".join(transformers.AutoModelForCausalLM.from_pretrained(out / "base").state_dict())


def test_transformers_plus_peft_gives_sampans_logits(fine_tuned):
    model, _, out = fine_tuned
    base = transformers.AutoModelForCausalLM.from_pretrained(out / "base")
    peft_model = peft.PeftModel.from_pretrained(base, out / "adapter").eval()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = model(ids)
        theirs = peft_model(input_ids=ids).logits
    assert (ours - theirs).abs().max().item() < 1e-4
    # The update is real: without it the logits move.
    with torch.no_grad(), without_lora(model):
        assert (model(ids) - ours).abs().max().item() > 1e-3
    merged = peft_model.merge_and_unload()
    with torch.no_grad():
        assert (merged(input_ids=ids).logits - ours).abs().max().item() < 1e-4


def test_merged_sampan_model_exports_whole(fine_tuned, tmp_path):
    model, _, _ = fine_tuned
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(ids)
    import copy

    merged = copy.deepcopy(model)
    assert merge_lora(merged) == 3 * merged.config.num_layers
    merged.save_pretrained(tmp_path / "merged", format="hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        assert (hf(input_ids=ids).logits - expected).abs().max().item() < 1e-4


def test_lora_on_gpt2s_fused_attention_is_refused_with_the_way_out(tmp_path):
    model = sampan.models.create("gpt-tiny", num_layers=1)
    apply_lora(model, ["q_proj"], rank=2, alpha=4, within="gpt.")
    with pytest.raises(ValueError, match="fuses q / k / v.*merge_lora"):
        save_peft_adapter(model, tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_a_model_without_lora_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no LoRA layers"):
        save_peft_adapter(sampan.models.create("llama-tiny"), tmp_path / "a")

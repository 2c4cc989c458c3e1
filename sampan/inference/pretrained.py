"""``export_pretrained``: sampan's own models as inference directories, checked against eager."""

from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sampan.inference.config import MODEL_PREFIX
from sampan.inference.export import export_model
from sampan.static import InputSpec
from sampan.store.model_dir import TASK_FILE, ModelDir
from sampan.text.features import FEATURE_NAMES, CharFeatures

# Extra files of a model directory that travel with its export (tokenizer, task head, model config).
COMPANION_FILES = ("tokenizer.json", TASK_FILE, "config.json")
# Shapes the exported graph is run on before it is kept: other batch sizes and lengths than the
# export's example (3 x 3), compared with the eager model.
VERIFY_SHAPES = ((1, 5), (3, 17), (1, 17), (3, 5))
VERIFY_TOLERANCE = 1e-4


class EncoderLogits(nn.Module):
    """An ERNIE head as ``(input_ids [B, S], attention_mask [B, S]) -> logits``.

    A model that embeds character features (pinyin / radical / stroke) gets them inside the graph:
    ``feature_table [vocab, k]`` (the ``CharFeatures`` columns it uses) is a constant of the graph,
    and each token's feature ids are gathered from it. So the graph's inputs stay the two a
    tokenizer makes, and Taskflow or any client runs such a model like any other.
    """

    def __init__(self, model: nn.Module, feature_table: torch.Tensor | None = None,
                 feature_names: tuple[str, ...] = ()):
        super().__init__()
        self.model = model
        self.feature_names = feature_names
        if feature_table is not None:
            self.register_buffer("feature_table", feature_table, persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if not self.feature_names:
            return self.model(input_ids, attention_mask=attention_mask)
        rows = self.feature_table[input_ids]
        features = {f"{name}_ids": rows[..., i] for i, name in enumerate(self.feature_names)}
        return self.model(input_ids, attention_mask=attention_mask, **features)


class DecoderLogits(nn.Module):
    """A causal language model (GPT, Llama / Qwen) as ``input_ids [B, S] -> logits [B, S, V]``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)


# Heads by what their graph takes: encoder heads read a padding mask, causal LMs only the ids.
ENCODER_HEADS = ("sequence_classification", "token_classification", "masked_lm")
DECODER_HEADS = ("causal_lm",)


def _wrap(model: nn.Module, features: CharFeatures | None = None) -> tuple[nn.Module, list[InputSpec]]:
    from sampan.models import spec_of

    ids = InputSpec([None, None], "int64", "input_ids")
    head = getattr(type(model), "head", None)
    if spec_of(model) is None or head not in ENCODER_HEADS + DECODER_HEADS:
        raise TypeError(f"export_pretrained takes a sampan model with a {' / '.join(ENCODER_HEADS + DECODER_HEADS)} "
                        f"head, got {type(model).__name__}; export other models with "
                        "sampan.inference.export_model(fn, out_dir, input_spec)")
    if head in DECODER_HEADS:
        return DecoderLogits(model), [ids]
    config = model.config
    names = tuple(f for f in FEATURE_NAMES if getattr(config, f"{f}_vocab_size", 0))
    specs = [ids, InputSpec([None, None], "int64", "attention_mask")]
    if not names:
        return EncoderLogits(model), specs
    if features is None:
        raise ValueError(f"the model embeds {', '.join(names)} features: pass features=CharFeatures.load(...) "
                         "(the features.json beside its weights) so the graph can look them up; "
                         "export_model_dir and `sampan export` find it themselves")
    if features.table.shape[0] < config.vocab_size:
        raise ValueError(f"features cover {features.table.shape[0]} token ids but the model's vocab_size is "
                         f"{config.vocab_size}: they do not belong together")
    columns = [FEATURE_NAMES.index(n) for n in names]
    table = torch.from_numpy(features.table[: config.vocab_size, columns].copy())
    return EncoderLogits(model, table, names), specs


def _verification_inputs(wrapper: nn.Module, n_inputs: int) -> list[list[torch.Tensor]]:
    config = wrapper.model.config
    generator = torch.Generator().manual_seed(0)
    cases = []
    for batch, seq in VERIFY_SHAPES:
        seq = min(seq, config.max_position_embeddings)
        ids = torch.randint(1, config.vocab_size, (batch, seq), generator=generator)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[-1, seq // 2:] = 0  # a padded row: the mask must really be an input of the graph
        cases.append([ids, mask][:n_inputs])
    return cases


def verify_devices(device: str = "cpu") -> dict[str, str]:
    """Where the export check runs each program for the spec ``device``: ``{"torch": ..., "onnxruntime":
    ...}``, each "cpu" or "cuda:N".

    The ``.pt2`` runs where torch puts ``device`` (a GPU spec and no GPU: a ``DeviceError``). The
    ``.onnx`` runs on ONNX Runtime's CUDA provider when this ONNX Runtime has one, and on the CPU
    otherwise (the plain onnxruntime wheel): the check still covers the file, only not on the GPU.
    """
    from sampan.inference.device import CUDA_PROVIDER, predictor_device
    from sampan.utils.device import check_device_spec

    device = check_device_spec(device)
    if device == "cpu":
        return {"torch": "cpu", "onnxruntime": "cpu"}
    import onnxruntime

    on_ort = device if CUDA_PROVIDER in onnxruntime.get_available_providers() else "cpu"
    return {"torch": predictor_device(device, "torch"), "onnxruntime": predictor_device(on_ort, "onnxruntime")}


def _verifier(wrapper: nn.Module, n_inputs: int, device: str = "cpu"):
    """Check a finished directory: both files, at several shapes, on ``verify_devices(device)``,
    equal the eager model (which runs on the CPU, in float32, as exported)."""
    devices = verify_devices(device)  # before the export: a GPU that is not there fails at once

    def verify(directory: Path) -> None:
        from sampan.inference.config import Config
        from sampan.inference.predictor import create_predictor

        backends = ["torch"] + (["onnxruntime"] if (directory / f"{MODEL_PREFIX}.onnx").is_file() else [])
        predictors = {b: create_predictor(Config(directory, backend=b, device=devices[b])) for b in backends}
        for inputs in _verification_inputs(wrapper, n_inputs):
            with torch.no_grad():
                expected = wrapper(*inputs).numpy()
            for backend, predictor in predictors.items():
                got = predictor.run([t.numpy() for t in inputs])[0]
                diff = float(np.abs(got - expected).max()) if got.shape == expected.shape else float("inf")
                if not diff <= VERIFY_TOLERANCE * max(1.0, float(np.abs(expected).max())):
                    raise RuntimeError(f"the exported {backend} graph on {devices[backend]} differs from the eager "
                                       f"model at input shape "
                                       f"{list(inputs[0].shape)}: max |diff| {diff:.3g} (shape {list(got.shape)} "
                                       f"vs {list(expected.shape)}); the export is not kept")

    return verify


def export_pretrained(model: nn.Module, out_dir: str | os.PathLike[str], *, task: str | None = None,
                      overwrite: bool = False, extra_files: tuple[str | os.PathLike[str], ...] = (),
                      verify: bool = True, features: CharFeatures | None = None, verify_device: str = "cpu",
                      decode_graphs: bool = True) -> Path:
    """Export one of sampan's models to an inference directory with dynamic batch and sequence.

    Encoder heads (ERNIE's) become ``(input_ids [B, S], attention_mask [B, S]) -> logits`` and
    causal LMs (GPT, Llama / Qwen) ``input_ids [B, S] -> logits [B, S, V]`` (int64 inputs; inputs
    named ``input_ids`` / ``attention_mask``, the output ``logits``). The graph runs in float32
    on CPU whatever the model's dtype and device (a copy is upcast / moved; int8 is the small format).
    Before the directory is kept, both the ONNX and torch programs are run at batch 1 and 3 and
    lengths 5 and 17 and must equal the eager model within 1e-4 (``verify=False`` skips this), on
    ``verify_device`` (default "cpu"; "cuda" / "cuda:N" / "auto" run them on a GPU as
    :func:`verify_devices` says). The files are traced on the CPU whatever it is, and run anywhere.
    ``task`` is recorded in ``inference.json`` under ``sampan_model``; ``extra_files`` are copied in.
    A model with pinyin / radical / stroke embeddings needs ``features`` (its ``features.json``):
    the graph looks each token's feature ids up itself, so its inputs stay the same two.
    A causal LM also gets its prefill and one-step decode graphs with the KV cache as inputs and
    outputs (``prefill/``, ``decode/``: ``sampan.inference.decode_export``), checked the same way,
    which ``create_generator`` and Taskflow run in O(n) per new token; ``decode_graphs=False``
    writes the full-window graph alone.
    """
    if any(p.device.type != "cpu" or (p.is_floating_point() and p.dtype != torch.float32)
           for p in model.parameters()):
        # The graph is exported for CPU float32 (what ONNX Runtime's CPU provider runs); the caller's
        # model is left as it is.
        wrapper, specs = _wrap(copy.deepcopy(model).to("cpu", torch.float32), features)
    else:
        wrapper, specs = _wrap(model, features)
    training = model.training
    wrapper.eval()
    try:
        check = _verifier(wrapper, len(specs), verify_device) if verify else None
        with_decode = decode_graphs and getattr(type(model), "head", None) in DECODER_HEADS
        decoder = wrapper.model if with_decode else None
        out = export_model(wrapper, out_dir, specs, overwrite=overwrite, output_names=["logits"],
                           extra_files=extra_files, verify=_then_record(check, model, task, decoder, verify_device))
    finally:
        model.train(training)
    return out


def _then_record(check, model: nn.Module, task: str | None, decoder: nn.Module | None = None,
                 verify_device: str = "cpu"):
    """Record the model's architecture, config and task in inference.json, then verify; with a
    ``decoder`` (the float32 CPU causal LM), first write and check its decode graphs beside."""

    def step(directory: Path) -> None:
        path = directory / f"{MODEL_PREFIX}.json"
        meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        meta["sampan_model"] = {"architecture": type(model).__name__, "task": task,
                                "config": model.config.to_dict()}
        if decoder is not None:
            from sampan.inference.decode_export import export_decode_graphs

            devices = verify_devices(verify_device) if check is not None else None
            meta["decode_graphs"] = export_decode_graphs(decoder, directory, verify=check is not None, devices=devices)
        path.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        if check is not None:
            check(directory)

    return step


def export_model_dir(model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *,
                     overwrite: bool = False, task: str | None = None, verify_device: str = "cpu") -> Path:
    """Export a saved sampan model, taking its tokenizer.json / task.json / config.json along; what
    ``sampan export`` runs.

    ``model_dir`` is a directory written by ``save_pretrained`` (config.json + model.safetensors), a
    fine-tuned model (``task.json``, either layout: ``sampan finetune --save adapter`` writes only
    the trained tensors over a base, which are loaded over it and merged first), or the name of a
    stored model (``sampan hub list``: ``ernie-tiny-sentiment``). An adapter-layout model has no
    tokenizer of its own: its base's is taken, and the ``task.json`` copied drops ``base_model_dir``,
    since the exported graph holds the merged weights. ``verify_device``: where the export is
    checked (``export_pretrained``).
    """
    source = _model_source(model_dir)
    model = load_model_dir(source)
    layout = ModelDir(source)
    meta = layout.task_meta or {}
    if not layout.is_adapter:  # the companions are all here: they travel verbatim
        extras = [source / name for name in COMPANION_FILES if (source / name).is_file()]
        return export_pretrained(model, out_dir, task=task or meta.get("task"), overwrite=overwrite,
                                 extra_files=tuple(extras), features=model_features(source),
                                 verify_device=verify_device)
    extras = [path for path in (layout.file("tokenizer.json"), source / "config.json") if path and path.is_file()]
    del meta["base_model_dir"]  # the graph holds the merged weights: no base travels with it
    with tempfile.TemporaryDirectory(prefix="sampan-export-") as tmp:
        copy_of_task = Path(tmp) / TASK_FILE
        copy_of_task.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return export_pretrained(model, out_dir, task=task or meta.get("task"), overwrite=overwrite,
                                 extra_files=(*extras, copy_of_task), features=model_features(source),
                                 verify_device=verify_device)


def load_model_dir(model_dir: str | os.PathLike[str]) -> nn.Module:
    """A stored or saved model directory as an fp32 eval-mode module.

    An adapter layout (``task.json`` names a base) or a model with adapter modules goes through
    ``sampan.finetune.load_task_model`` (loaded over the base, LoRA merged); anything else is
    ``from_pretrained`` (a merged fine-tune's ``task.json`` is not needed for that).
    """
    source = Path(model_dir)
    layout = ModelDir(source)
    if layout.is_adapter or (layout.task_meta or {}).get("method") == "adapter":
        from sampan.finetune import load_task_model

        model, _, _ = load_task_model(source)
    else:
        from sampan.models.pretrained import from_pretrained

        model = from_pretrained(source, dtype="float32")
    return model.float().eval()


def model_features(model_dir: str | os.PathLike[str]) -> CharFeatures | None:
    """The ``features.json`` of a model directory, or of its base for an adapter layout; None if neither has one."""
    found = ModelDir(Path(model_dir)).file("features.json")
    return CharFeatures.load(found) if found else None


def _model_source(model_dir: str | os.PathLike[str]) -> Path:
    """A model directory as given, or the store's directory for a model name."""
    path = Path(model_dir)
    if path.is_dir() or os.sep in str(model_dir):
        return path  # a path: from_pretrained / load_task_model say what is wrong with it
    from sampan.store.models import ModelNotFoundError, resolve

    try:
        return resolve(str(model_dir))
    except ModelNotFoundError as err:
        raise FileNotFoundError(f"{model_dir} is neither a model directory nor a stored model: {err}") from None

"""A model directory's weight files, read and written the way Hugging Face lays them out.

Read: ``model.safetensors``, or shards listed by ``model.safetensors.index.json``; failing those,
the legacy ``pytorch_model.bin`` (or its index) through ``torch.load(weights_only=True)``, which
refuses anything but tensors and plain containers, so nothing untrusted is ever unpickled.
Tensors stream one file at a time (a 405B checkpoint never sits in memory twice).

Write: ``model.safetensors`` when everything fits under ``max_shard_size``, else
``model-00001-of-0000N.safetensors`` shards and the index, as ``transformers`` writes them.

Int8 storage (``quantize_file``): the model store keeps large shipped models' matrices as int8 with
one fp16 scale per row (symmetric, weight-only: what LLM.int8's and GPTQ's weight-only baselines call
per-channel absmax), half fp16's bytes. Reading dequantizes to fp16 transparently, so every loader
sees ordinary tensors; the file says so in its header (``QUANT_KEY``) and nothing else reads the
scales. Vectors (biases, norms) stay fp16: they are few bytes and quantize badly.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_BIN = "pytorch_model.bin"
PICKLE_INDEX = "pytorch_model.bin.index.json"
# In order of preference.
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, PICKLE_BIN, PICKLE_INDEX)
DEFAULT_MAX_SHARD_SIZE = "5GB"
QUANT_KEY, INT8_ROWWISE = "sampan_quantization", "int8-rowwise"
SCALE_SUFFIX = ".__int8_row_scale__"  # a suffix no module attribute can have
_MIN_QUANT_ROWS = 16  # smaller matrices (type embeddings, tiny heads) are not worth a scale each

_SAFETENSORS_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """Bytes from an int or a string such as ``"5GB"``, ``"500MB"``, ``"2GiB"`` (as transformers reads them)."""
    if isinstance(size, bool):
        raise TypeError("max_shard_size must be a number of bytes or a string such as '5GB'")
    if isinstance(size, int):
        value = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(size).upper())
        if not match:
            raise ValueError(f"max_shard_size {size!r} is not a size; write bytes (10000000) or e.g. '5GB', '500MB'")
        value = int(float(match.group(1)) * _UNITS[match.group(2)])
    if value <= 0:
        raise ValueError(f"max_shard_size must be > 0 bytes, got {size!r}")
    return value


def weight_files(directory: str | os.PathLike) -> list[Path]:
    """The files holding a directory's weights, in load order; a clear error when there are none."""
    directory = Path(directory)
    for name in WEIGHT_FILES:
        path = directory / name
        if not path.is_file():
            continue
        if not name.endswith(".index.json"):
            return [path]
        try:
            index = json.loads(path.read_text(encoding="utf-8"))
            weight_map = index["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path} is not a checkpoint index (a JSON object with a 'weight_map'): {err}") from None
        return [_shard_path(directory, shard) for shard in sorted(set(weight_map.values()))]
    raise FileNotFoundError(f"no weights in {directory}: expected one of {', '.join(WEIGHT_FILES)}")


def _shard_path(directory: Path, name: str) -> Path:
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise ValueError(f"{directory}: shard file name {name!r} must be a plain file name in the directory")
    path = directory / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found (listed in the checkpoint's index file)")
    return path


def _load_pickle_file(path: Path) -> dict[str, torch.Tensor]:
    try:  # mmap keeps a large file out of memory; files in torch's pre-1.6 format cannot be mapped
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap" not in str(err):
            raise
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} is not a state dict of tensors")
    return state


def _quantized(f) -> bool:
    return (f.metadata() or {}).get(QUANT_KEY) == INT8_ROWWISE


def tensor_names(files: list[Path]) -> set[str]:
    """Every tensor name in ``files``, without reading the safetensors data."""
    names: set[str] = set()
    for path in files:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                names.update(k for k in f.keys() if not k.endswith(SCALE_SUFFIX))
        else:
            names.update(_load_pickle_file(path))
    return names


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor of ``files``, on the CPU, one at a time."""
    for path in files:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                quantized = _quantized(f)
                keys = set(f.keys())
                for name in f.keys():
                    if name.endswith(SCALE_SUFFIX):
                        continue
                    tensor = f.get_tensor(name)
                    if quantized and name + SCALE_SUFFIX in keys:
                        tensor = dequantize_int8(tensor, f.get_tensor(name + SCALE_SUFFIX))
                    yield name, tensor
        else:
            yield from _load_pickle_file(path).items()


def quantize_int8(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(int8 values, fp16 scale per row)`` of a 2-D float tensor: symmetric absmax per row, so
    ``values * scale`` is within half a step (``scale / 2``) of every entry. A zero row keeps scale 1."""
    if tensor.ndim != 2 or not tensor.is_floating_point():
        raise ValueError(f"int8 row-wise quantization takes a 2-D float tensor, got {tuple(tensor.shape)} {tensor.dtype}")
    absmax = tensor.float().abs().amax(dim=1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / 127.0, torch.ones_like(absmax)).half()
    values = torch.round(tensor.float() / scale.float()).clamp(-127, 127).to(torch.int8)
    return values, scale


def dequantize_int8(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp16 weights back from ``quantize_int8``'s values and per-row scales."""
    if values.dtype != torch.int8 or scale.shape != (values.shape[0], 1):
        raise ValueError(f"an int8 row-wise tensor is int8 [rows, cols] with an fp16 [rows, 1] scale; got "
                         f"{values.dtype} {tuple(values.shape)} and {tuple(scale.shape)}")
    return (values.float() * scale.float()).half()


def quantize_file(path: str | os.PathLike) -> dict[str, int]:
    """Rewrite one safetensors file with its float matrices as int8 + a fp16 scale per row (other
    float tensors in fp16), atomically; returns ``{"quantized", "bytes_before", "bytes_after"}``."""
    from safetensors.torch import load_file

    from sampan.utils.atomic import atomic_path

    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata() or {})
    if meta.get(QUANT_KEY) == INT8_ROWWISE:
        raise ValueError(f"{path} is already int8 row-wise quantized")
    before = load_file(str(path))
    out: dict[str, torch.Tensor] = {}
    quantized = 0
    for name, tensor in before.items():
        if tensor.is_floating_point() and tensor.ndim == 2 and tensor.shape[0] >= _MIN_QUANT_ROWS:
            out[name], out[name + SCALE_SUFFIX] = quantize_int8(tensor)
            quantized += 1
        else:
            out[name] = tensor.half() if tensor.is_floating_point() else tensor
    with atomic_path(path) as tmp:
        save_file(out, str(tmp), metadata={"format": "pt", **meta, QUANT_KEY: INT8_ROWWISE})
    return {"quantized": quantized, "bytes_before": sum(_nbytes(t) for t in before.values()),
            "bytes_after": sum(_nbytes(t) for t in out.values())}


def stored_float_dtype(files: list[Path]) -> torch.dtype | None:
    """The dtype of the first floating tensor stored (None if there is none)."""
    for path in files:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                if _quantized(f):
                    return torch.float16  # what reading dequantizes to
                for name in f.keys():
                    mapped = _SAFETENSORS_DTYPES.get(f.get_slice(name).get_dtype())
                    if mapped is not None:
                        return mapped
        else:
            for tensor in _load_pickle_file(path).values():
                if tensor.is_floating_point():
                    return tensor.dtype
    return None


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def write_weights(tensors: Mapping[str, torch.Tensor], directory: str | os.PathLike,
                  max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, metadata: Mapping[str, str] | None = None) -> list[Path]:
    """Write ``tensors`` into ``directory`` as one file or as shards plus an index; returns the files.

    Shards fill in name order up to ``max_shard_size`` bytes each (a tensor larger than that gets a
    shard of its own), as transformers does. ``metadata`` goes into every file's header, with
    ``format: pt``, which transformers requires.
    """
    directory = Path(directory)
    limit = parse_size(max_shard_size)
    meta = {"format": "pt", **(metadata or {})}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu").contiguous()
        if shards[-1] and size + _nbytes(tensor) > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += _nbytes(tensor)
    if len(shards) == 1:
        path = directory / SAFETENSORS
        save_file(shards[0], str(path), metadata=meta)
        return [path]
    paths, weight_map = [], {}
    for i, shard in enumerate(shards, start=1):
        path = directory / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path), metadata=meta)
        paths.append(path)
        weight_map.update(dict.fromkeys(shard, path.name))
    total = sum(_nbytes(t) for shard in shards for t in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [*paths, directory / SAFETENSORS_INDEX]

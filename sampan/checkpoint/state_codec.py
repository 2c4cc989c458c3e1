"""Turn nested training state into safetensors tensors plus a JSON skeleton, and back, exactly.

Why not ``torch.save``: it pickles, and unpickling a file runs whatever code the file names
(DESIGN.md principle 6). Safetensors holds only tensors and JSON holds only plain data, so a
state is split in two: every tensor-like leaf goes into a flat ``{key: Tensor}`` dict, and the
structure around it becomes a JSON skeleton in which each leaf is a placeholder naming its key.

The skeleton is strict JSON (no NaN / Infinity literals) and records what plain JSON would lose:

============================  ==================================================================
Python value                  skeleton
============================  ==================================================================
None, bool, int, str          itself
float                         itself if finite, else ``{"$float": "nan" | "inf" | "-inf"}``
list                          a JSON array
tuple                         ``{"$tuple": [...]}``
dict with only str keys       ``{"$dict": {key: value, ...}}``
dict with any int key         ``{"$items": [[key, value], ...]}`` (JSON keeps 3 apart from "3")
OrderedDict                   either of the above plus ``"ordered": true`` and its ``_metadata``
torch.Tensor / nn.Parameter   ``{"$tensor": key}`` (+ ``"parameter"``, ``"requires_grad"``)
numpy.ndarray                 ``{"$ndarray": key, "dtype": "<f8"}``
numpy scalar (np.float32(1))  ``{"$npscalar": key, "dtype": "<f4"}``
bytes                         ``{"$bytes": key}`` (a uint8 tensor)
============================  ==================================================================

A tensor whose dtype older safetensors releases cannot store (complex128, float8_e8m0, uint32, ...)
is stored as its raw bytes (uint8) with ``"as": {"dtype": ..., "shape": [...]}`` beside the key, so
files stay readable by every safetensors >= 0.4 and the value still comes back bit for bit.

Anything else raises ``TypeError`` naming where in the state it sits (``optimizer.state.3.step``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

SKELETON_FORMAT = "sampan-state"
SKELETON_VERSION = 1

# Dtypes every safetensors release since 0.3 reads and writes; others travel as raw bytes (see above).
_NATIVE_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    }
)
# Safetensors keeps its own header entry under this name, so no tensor may use it.
_RESERVED_KEYS = frozenset({"__metadata__"})
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def flatten_state(obj: Any, *, root: str = "") -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Split ``obj`` into ``(tensors, skeleton)``: CPU tensors for safetensors and a JSON-able skeleton.

    ``root`` prefixes the paths in error messages (``save_checkpoint`` passes the component name).
    Tensor keys are the dotted paths inside ``obj`` (``state.0.exp_avg``), made unique if two collide.
    Tensors that share storage come back as separate copies (safetensors cannot alias). Tensors on
    an accelerator are copied to the CPU; ``unflatten_state`` returns CPU tensors.
    CPU tensors and numpy arrays are not copied: write the result out before changing them.

    Raises:
        TypeError: a value of a type not listed in this module's docstring, naming its path.
    """
    encoder = _Encoder(root)
    body = encoder.encode(obj, [])
    return encoder.tensors, {"format": SKELETON_FORMAT, "version": SKELETON_VERSION, "root": body}


def unflatten_state(tensors: dict[str, Tensor], skeleton: dict[str, Any]) -> Any:
    """Rebuild the object ``flatten_state`` split into ``tensors`` and ``skeleton``.

    Raises:
        ValueError: the skeleton is malformed, names a tensor that is missing, or ``tensors`` holds
            tensors the skeleton never names (a sign the two files do not belong together).
    """
    if not isinstance(skeleton, dict) or skeleton.get("format") != SKELETON_FORMAT:
        raise ValueError(f"not a {SKELETON_FORMAT} skeleton (its 'format' field is missing or different)")
    version = skeleton.get("version")
    if version != SKELETON_VERSION:
        raise ValueError(
            f"skeleton version {version!r} is not supported (this sampan reads version {SKELETON_VERSION}); "
            "a newer sampan wrote it"
        )
    if "root" not in skeleton:
        raise ValueError("skeleton has no 'root' entry")
    decoder = _Decoder(tensors)
    obj = decoder.decode(skeleton["root"], [])
    unused = sorted(set(tensors) - decoder.used)
    if unused:
        raise ValueError(f"tensors {unused[:5]} are not named by the skeleton: the two files do not match")
    return obj


def _dotted(parts: list[str]) -> str:
    return ".".join(parts) if parts else "<root>"


class _Encoder:
    def __init__(self, root: str) -> None:
        self.root = root
        self.tensors: dict[str, Tensor] = {}
        # Storage pointers already saved: safetensors refuses two entries over one storage.
        self._storages: set[int] = set()

    def fail(self, parts: list[str], what: str, hint: str) -> TypeError:
        where = ".".join([self.root, *parts]) if self.root else _dotted(parts)
        return TypeError(f"cannot checkpoint {what} at {where!r}: {hint}")

    def encode(self, x: Any, parts: list[str]) -> Any:
        # Exact type checks, not isinstance: np.float64 is a float and an IntEnum an int, and each
        # would come back as a different type than went in.
        kind = type(x)
        if x is None or kind in (bool, int, str):
            return x
        if kind is float:
            if math.isfinite(x):
                return x  # json writes repr(x), which reads back to the same double
            return {"$float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if kind in (dict, OrderedDict):
            return self._dict(x, parts)
        if kind is list:
            return [self.encode(v, [*parts, str(i)]) for i, v in enumerate(x)]
        if kind is tuple:
            return {"$tuple": [self.encode(v, [*parts, str(i)]) for i, v in enumerate(x)]}
        if isinstance(x, Tensor):
            return self._tensor(x, parts)
        if kind is np.ndarray:
            return {**self._put("$ndarray", self._from_numpy(x, parts), parts), "dtype": x.dtype.str}
        if isinstance(x, np.generic):
            data = self._from_numpy(np.asarray(x), parts)
            return {**self._put("$npscalar", data, parts), "dtype": x.dtype.str}
        if kind is bytes:
            return self._put("$bytes", torch.from_numpy(np.frombuffer(x, dtype=np.uint8).copy()), parts)
        if hasattr(x, "__dataclass_fields__"):
            hint = "convert the dataclass with dataclasses.asdict() first"
        elif hasattr(x, "state_dict"):
            hint = "save its .state_dict() instead of the object"
        else:
            hint = "supported are None, bool, int, float, str, bytes, list, tuple, dict, torch.Tensor and numpy arrays"
        raise self.fail(parts, f"a {kind.__module__}.{kind.__qualname__}", hint)

    def _dict(self, x: dict[Any, Any], parts: list[str]) -> dict[str, Any]:
        for key in x:
            if type(key) not in (str, int):
                raise self.fail(
                    [*parts, repr(key)],
                    f"a dict key of type {type(key).__qualname__}",
                    "keys must be str or int",
                )
        out: dict[str, Any]
        if all(type(key) is str for key in x):
            out = {"$dict": {key: self.encode(v, [*parts, key]) for key, v in x.items()}}
        else:
            out = {"$items": [[key, self.encode(v, [*parts, str(key)])] for key, v in x.items()]}
        if type(x) is OrderedDict:
            out["ordered"] = True
            # nn.Module.state_dict() hangs per-module versions here, and load_state_dict reads them.
            metadata = getattr(x, "_metadata", None)
            if metadata is not None:
                out["metadata"] = self.encode(metadata, [*parts, "_metadata"])
        return out

    def _tensor(self, x: Tensor, parts: list[str]) -> dict[str, Any]:
        if type(x) not in (Tensor, nn.Parameter):
            raise self.fail(
                parts,
                f"a tensor subclass {type(x).__qualname__}",
                "gather it into a plain tensor first (DTensor: .full_tensor()) or save it with "
                "torch.distributed.checkpoint",
            )
        if x.layout != torch.strided or x.is_quantized or x.is_meta:
            raise self.fail(
                parts, "a sparse, quantized or meta tensor", "only dense tensors holding data can be saved"
            )
        desc = self._put("$tensor", x.detach().cpu().resolve_conj().resolve_neg().contiguous(), parts)
        if type(x) is nn.Parameter:
            desc["parameter"] = True
            desc["requires_grad"] = x.requires_grad
        elif x.requires_grad:
            desc["requires_grad"] = True
        return desc

    def _from_numpy(self, x: np.ndarray, parts: list[str]) -> Tensor:
        what = f"a numpy array of dtype {x.dtype}"
        if x.dtype.kind not in "biufc":
            raise self.fail(parts, what, "only bool and numeric arrays can be saved")
        # torch only takes native byte order; the descriptor's dtype string restores the original.
        native = x.astype(x.dtype.newbyteorder("="), copy=False)
        # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones. from_numpy warns on read-only memory.
        if not (native.flags.c_contiguous and native.flags.writeable):
            native = native.copy(order="C")
        try:
            return torch.from_numpy(native)
        except TypeError as error:  # float128, for one, has no torch dtype
            raise self.fail(parts, what, str(error)) from error

    def _put(self, tag: str, data: Tensor, parts: list[str]) -> dict[str, Any]:
        """Store ``data`` under a fresh key; return the placeholder ``{tag: key, ...}``."""
        if data.numel():
            pointer = data.untyped_storage().data_ptr()
            if pointer in self._storages:
                data = data.clone()
                pointer = data.untyped_storage().data_ptr()
            self._storages.add(pointer)
        desc: dict[str, Any] = {tag: ""}
        if data.dtype not in _NATIVE_DTYPES:
            desc["as"] = {"dtype": str(data.dtype).removeprefix("torch."), "shape": list(data.shape)}
            data = data.reshape(-1).view(torch.uint8)
        base = _dotted(parts)
        key, n = base, 0
        while key in self.tensors or key in _RESERVED_KEYS:
            n += 1
            key = f"{base}~{n}"
        self.tensors[key] = data
        desc[tag] = key
        return desc


class _Decoder:
    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.tensors = tensors
        self.used: set[str] = set()

    def decode(self, node: Any, parts: list[str]) -> Any:
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is list:
            return [self.decode(v, [*parts, str(i)]) for i, v in enumerate(node)]
        if type(node) is not dict:
            raise self.bad(parts, f"unexpected JSON value of type {type(node).__name__}")
        if "$float" in node:
            if node["$float"] not in _NONFINITE:
                raise self.bad(parts, f"unknown float {node['$float']!r}")
            return _NONFINITE[node["$float"]]
        if "$tuple" in node:
            values = self.expect(node, "$tuple", list, parts)
            return tuple(self.decode(v, [*parts, str(i)]) for i, v in enumerate(values))
        if "$dict" in node:
            items = self.expect(node, "$dict", dict, parts).items()
            return self.finish_dict(node, [(k, self.decode(v, [*parts, k])) for k, v in items], parts)
        if "$items" in node:
            pairs = []
            for pair in self.expect(node, "$items", list, parts):
                if type(pair) is not list or len(pair) != 2 or type(pair[0]) not in (str, int):
                    raise self.bad(parts, "each $items entry must be [str-or-int key, value]")
                pairs.append((pair[0], self.decode(pair[1], [*parts, str(pair[0])])))
            return self.finish_dict(node, pairs, parts)
        if "$tensor" in node:
            data = self.take(node, "$tensor", parts)
            if node.get("parameter"):
                return nn.Parameter(data, requires_grad=bool(node.get("requires_grad", True)))
            return data.requires_grad_(True) if node.get("requires_grad") else data
        if "$ndarray" in node:
            return self.to_numpy(self.take(node, "$ndarray", parts), node, parts)
        if "$npscalar" in node:
            return self.to_numpy(self.take(node, "$npscalar", parts), node, parts)[()]
        if "$bytes" in node:
            return self.take(node, "$bytes", parts).numpy().tobytes()
        raise self.bad(parts, f"unknown object with keys {sorted(node)[:5]}")

    def bad(self, parts: list[str], why: str) -> ValueError:
        return ValueError(f"malformed skeleton at {_dotted(parts)!r}: {why}")

    def expect(self, node: dict[str, Any], tag: str, kind: type, parts: list[str]) -> Any:
        value = node[tag]
        if type(value) is not kind:
            raise self.bad(parts, f"{tag} must hold a JSON {'array' if kind is list else 'object'}")
        return value

    def finish_dict(
        self, node: dict[str, Any], pairs: list[tuple[Any, Any]], parts: list[str]
    ) -> dict[Any, Any]:
        if not node.get("ordered"):
            return dict(pairs)
        out: OrderedDict[Any, Any] = OrderedDict(pairs)
        if "metadata" in node:
            out._metadata = self.decode(node["metadata"], [*parts, "_metadata"])  # type: ignore[attr-defined]
        return out

    def take(self, node: dict[str, Any], tag: str, parts: list[str]) -> Tensor:
        key = node[tag]
        if type(key) is not str:
            raise self.bad(parts, f"{tag} must name a tensor key")
        if key not in self.tensors:
            raise ValueError(f"tensor {key!r} (for {_dotted(parts)!r}) is missing from the tensor file")
        self.used.add(key)
        data = self.tensors[key]
        layout = node.get("as")
        if layout is None:
            return data
        dtype = getattr(torch, str(layout.get("dtype")), None) if type(layout) is dict else None
        if (
            not isinstance(dtype, torch.dtype)
            or data.dtype != torch.uint8
            or type(layout.get("shape")) is not list
        ):
            raise self.bad(parts, f"bad raw-bytes layout {layout!r} for a {data.dtype} tensor")
        # view() to a wider dtype needs an aligned start; a fresh copy has offset 0.
        raw = data.reshape(-1).clone() if data.storage_offset() else data.reshape(-1)
        return raw.view(dtype).reshape(layout["shape"])

    def to_numpy(self, data: Tensor, node: dict[str, Any], parts: list[str]) -> np.ndarray:
        name = node.get("dtype")
        try:
            dtype = np.dtype(name) if type(name) is str else None
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in "biufc":
            raise self.bad(parts, f"bad numpy dtype {name!r}")
        array = data.numpy()
        return array if array.dtype.str == dtype.str else array.astype(dtype)

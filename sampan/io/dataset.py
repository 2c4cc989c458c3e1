"""Map-style datasets, and raw binary token files (nanoGPT style: a flat array of token ids, no header)."""

from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from sampan.utils.atomic import atomic_open

__all__ = ["ALLOWED_TOKEN_DTYPES", "Dataset", "TokenWindowDataset", "write_token_file"]

# Token files hold ids as unsigned little-endian integers: uint16 covers vocabularies up to 65,536
# (GPT-2's 50,257), uint32 anything larger (a 100K+ Chinese vocabulary). The byte order is fixed
# rather than native so a file written on one machine reads the same on any other.
ALLOWED_TOKEN_DTYPES: dict[str, np.dtype] = {
    "uint16": np.dtype("<u2"),
    "uint32": np.dtype("<u4"),
}


def _token_dtype(dtype: Any) -> np.dtype:
    """The little-endian numpy dtype for ``dtype`` ("uint16" / "uint32" or the numpy type), else ValueError."""
    try:
        name = np.dtype(dtype).name
    except TypeError as exc:
        raise ValueError(f"token dtype must be one of {sorted(ALLOWED_TOKEN_DTYPES)}, got {dtype!r}") from exc
    if name not in ALLOWED_TOKEN_DTYPES:
        raise ValueError(f"token dtype must be one of {sorted(ALLOWED_TOKEN_DTYPES)}, got {dtype!r}")
    return ALLOWED_TOKEN_DTYPES[name]


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return int(value)


class TokenWindowDataset(Dataset):
    """Fixed-length windows over a 1-D array of token ids, for causal-LM pretraining.

    Window ``i`` is ``tokens[i * stride : i * stride + seq_len]``; a window that would run past
    the end is not produced, so there are ``(len(tokens) - seq_len) // stride + 1`` of them.
    Each item is ``{"input_ids": LongTensor[seq_len], "labels": LongTensor[seq_len]}`` where
    ``labels`` is a copy of ``input_ids``: sampan's models shift labels internally, as Hugging
    Face models do, so the dataset need not know the model's convention.

    Args:
        tokens: a 1-D integer ``numpy.ndarray`` (``np.memmap`` included: only the windows read
            are paged in), ``torch.Tensor`` or sequence of ints.
        seq_len: tokens per window (> 0).
        stride: start-to-start distance between windows (> 0); defaults to ``seq_len``
            (non-overlapping windows). A smaller stride gives overlapping windows.
    """

    def __init__(
        self, tokens: np.ndarray | torch.Tensor | Any, seq_len: int, stride: int | None = None
    ) -> None:
        self.seq_len = _check_positive_int("seq_len", seq_len)
        self.stride = self.seq_len if stride is None else _check_positive_int("stride", stride)
        if isinstance(tokens, torch.Tensor):
            if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
                raise ValueError(f"tokens must hold integer ids, got a tensor of {tokens.dtype}")
            tokens = tokens.detach()
        else:
            tokens = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
            if not np.issubdtype(tokens.dtype, np.integer):
                raise ValueError(f"tokens must hold integer ids, got an array of {tokens.dtype}")
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be 1-D, got shape {tuple(tokens.shape)}")
        if len(tokens) < self.seq_len:
            raise ValueError(
                f"tokens too short for one window: {len(tokens)} tokens < seq_len={self.seq_len}"
            )
        self.tokens = tokens
        self._num_windows = (len(tokens) - self.seq_len) // self.stride + 1
        # Set by from_file, so a pickled copy (a spawned worker) reopens the file instead of
        # carrying the whole memmap's contents through the pipe.
        self._file: tuple[str, str] | None = None

    @classmethod
    def from_file(
        cls, path: str | os.PathLike, dtype: str = "uint16", *, seq_len: int, stride: int | None = None
    ) -> TokenWindowDataset:
        """Windows over a raw token file written by :func:`write_token_file`, memory-mapped read-only.

        Args:
            path: the token file (``dtype`` ids, little-endian, no header).
            dtype: ``"uint16"`` or ``"uint32"``, as written.
            seq_len: tokens per window.
            stride: start-to-start distance (defaults to ``seq_len``).
        """
        np_dtype = _token_dtype(dtype)
        seq_len = _check_positive_int("seq_len", seq_len)
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"token file {str(path)!r} does not exist")
        size = path.stat().st_size
        if size % np_dtype.itemsize:
            raise ValueError(
                f"token file {str(path)!r} has {size} bytes, not a multiple of {np_dtype.itemsize} "
                f"({np_dtype.name}): wrong dtype, or a truncated file"
            )
        count = size // np_dtype.itemsize
        if count < seq_len:
            # Checked before mapping: np.memmap cannot map an empty file and would say so obscurely.
            raise ValueError(
                f"token file {str(path)!r} too short for one window: {count} tokens < seq_len={seq_len}"
            )
        tokens = np.memmap(path, dtype=np_dtype, mode="r", shape=(count,))
        dataset = cls(tokens, seq_len=seq_len, stride=stride)
        dataset._file = (str(path), np_dtype.name)
        return dataset

    def __len__(self) -> int:
        return self._num_windows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        i = operator.index(index)
        if i < 0:
            i += self._num_windows
        if not 0 <= i < self._num_windows:
            raise IndexError(f"window index {index} out of range for {self._num_windows} windows")
        start = i * self.stride
        window = self.tokens[start : start + self.seq_len]
        if isinstance(window, torch.Tensor):
            input_ids = window.to(torch.long, copy=True)  # copy: never alias the caller's tensor
        else:
            input_ids = torch.from_numpy(np.array(window, dtype=np.int64))  # copies out of the memmap
        return {"input_ids": input_ids, "labels": input_ids.clone()}

    def __repr__(self) -> str:
        source = f"file={self._file[0]!r}" if self._file else f"tokens={len(self.tokens)}"
        return (
            f"TokenWindowDataset({source}, seq_len={self.seq_len}, stride={self.stride}, windows={len(self)})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._file is not None:
            state["tokens"] = None  # reopened in __setstate__
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._file is not None and self.tokens is None:
            path, dtype = self._file
            self.tokens = np.memmap(path, dtype=ALLOWED_TOKEN_DTYPES[dtype], mode="r")


def write_token_file(
    path: str | os.PathLike, tokens: np.ndarray | torch.Tensor | Any, dtype: str = "uint16"
) -> Path:
    """Write ``tokens`` (1-D integer ids) as a raw little-endian ``dtype`` file, atomically.

    The data goes to a temporary file in the same directory, is fsynced, then renamed over
    ``path`` (and the directory fsynced), so a crash leaves either the old file or the complete
    new one, never a torn file that would silently shift every later window.

    Raises:
        ValueError: ``dtype`` not "uint16"/"uint32", ``tokens`` not 1-D integers, empty, or an id
            outside the dtype's range (it would otherwise wrap around silently).
    """
    np_dtype = _token_dtype(dtype)
    array = tokens.detach().cpu().numpy() if isinstance(tokens, torch.Tensor) else np.asarray(tokens)
    if array.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {array.shape}")
    if array.size == 0:
        raise ValueError("tokens is empty: nothing to write")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"tokens must hold integer ids, got {array.dtype}")
    low, high = int(array.min()), int(array.max())
    limit = int(np.iinfo(np_dtype).max)
    if low < 0 or high > limit:
        bad = low if low < 0 else high
        raise ValueError(
            f"token id {bad} does not fit {np_dtype.name} (0..{limit}); use dtype='uint32' for large vocabularies"
        )
    path = Path(path)
    with atomic_open(path, "wb") as f:
        array.astype(np_dtype, copy=False).tofile(f)
    return path

"""Seeds derived from a tuple of integers, so every random stream in the data path has one documented source."""

from __future__ import annotations

import numpy as np

# Salts keep the streams apart: the same (seed, epoch) must not give the torch DataLoader's base
# seed and a worker's seed the same value, or two "independent" RNGs would draw identical numbers.
SALT_TORCH_LOADER = 0x53414D01
SALT_WORKER = 0x53414D02


def derive_seed(*keys: int) -> int:
    """A 63-bit seed mixed from non-negative integer ``keys`` with numpy's ``SeedSequence``.

    ``SeedSequence`` hashes its entropy, so nearby keys ((0, 1) and (1, 0)) give unrelated seeds;
    63 bits fit both ``torch.Generator.manual_seed`` and Python's ``random.seed``.
    """
    words = np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 32 | int(words[1])) & 0x7FFF_FFFF_FFFF_FFFF

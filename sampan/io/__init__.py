"""Data loading: datasets, memory-mapped token files, and a DataLoader that resumes at any batch.

::

    from sampan.io import DataLoader, TokenWindowDataset

    data = TokenWindowDataset.from_file("train.bin", "uint16", seq_len=1024)
    loader = DataLoader(data, batch_size=8, shuffle=True, seed=1234, num_workers=2)
    for batch in loader:                # one epoch, from the current position
        ...
    state = loader.state_dict()         # JSON-safe; save it with the checkpoint
    loader.load_state_dict(state)       # the next iteration continues with the next batch
"""

from sampan.io.collate import collate_dicts, default_collate
from sampan.io.dataloader import DataLoader
from sampan.io.dataset import ALLOWED_TOKEN_DTYPES, Dataset, TokenWindowDataset, write_token_file
from sampan.io.sampler import ResumableBatchSampler, ResumableSampler, epoch_order

__all__ = [
    "ALLOWED_TOKEN_DTYPES",
    "DataLoader",
    "Dataset",
    "ResumableBatchSampler",
    "ResumableSampler",
    "TokenWindowDataset",
    "collate_dicts",
    "default_collate",
    "epoch_order",
    "write_token_file",
]

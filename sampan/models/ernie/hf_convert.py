"""Placeholder replaced by the HF BERT loader (work in progress in this session)."""


def from_hf_bert(directory, head=None, device=None):
    raise NotImplementedError

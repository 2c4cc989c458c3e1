"""Test-wide settings."""

import torch

# The tests use tiny tensors, for which a second intra-op thread costs more than it gives
# (and CI runs on 2 cores). Results do not depend on the thread count.
torch.set_num_threads(1)

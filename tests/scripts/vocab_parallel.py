"""VocabParallelEmbedding on 2 gloo ranks against one nn.Embedding: outputs, gradients, and that each
rank's gradient holds only its own rows. Exits non-zero on a mismatch.

    torchrun --nproc_per_node 2 tests/scripts/vocab_parallel.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import parallelize_module

from sampan.nn.vocab_parallel import VocabParallelEmbedding


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))
    rank = dist.get_rank()
    for layout in (Replicate(), Shard(1)):
        torch.manual_seed(0)
        whole = torch.nn.Embedding(64, 8, padding_idx=40)  # the padding row lives on rank 1
        split = torch.nn.Embedding(64, 8, padding_idx=40)
        split.load_state_dict(whole.state_dict())
        parallelize_module(split, mesh, VocabParallelEmbedding(layout))
        ids = torch.randint(0, 64, (3, 6), generator=torch.Generator().manual_seed(1))
        ids[0, 0] = 40
        weights = torch.randn(3, 6, 8, generator=torch.Generator().manual_seed(2))
        want = whole(ids)
        (want * weights).sum().backward()
        got = split(ids)
        part = weights if layout == Replicate() else weights.chunk(2, dim=1)[rank]
        expected = want if layout == Replicate() else want.chunk(2, dim=1)[rank]
        torch.testing.assert_close(got, expected.detach(), rtol=0, atol=1e-6)
        (got * part).sum().backward()
        grad = split.weight.grad
        local = grad.to_local()
        assert grad.placements == (Shard(0),), grad.placements
        assert local.shape == (32, 8) and local.untyped_storage().nbytes() == 32 * 8 * 4, local.shape
        torch.testing.assert_close(grad.full_tensor(), whole.weight.grad, rtol=0, atol=1e-6)
        assert float(whole.weight.grad[40].abs().sum()) == 0.0  # the padding row learns nothing
    from sampan.distributed.env import shutdown

    shutdown()  # destroy the group, then os._exit: gloo can abort in interpreter teardown


if __name__ == "__main__":
    main()

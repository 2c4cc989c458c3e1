"""One real training step under a fleet strategy on gloo; every rank writes the bytes it holds.

    torchrun --nproc_per_node 8 tests/scripts/simulate_real.py OUT_DIR MODEL STRATEGY_JSON GLOBAL_BATCH SEQ_LEN

The same steps as ``sampan.distributed.simulate.simulate_rank`` (fleet.init, distributed_model,
distributed_optimizer, forward_backward, clip + AdamW step), on real tensors, so
``tests/test_simulate.py`` can hold the simulated parameter / gradient / optimizer bytes to these.
Each rank writes ``OUT_DIR/rank{r}.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import sampan
from sampan.distributed import env
from sampan.distributed.fleet import Fleet
from sampan.distributed.simulate import local_bytes
from sampan.distributed.strategy import DistributedStrategy


def main() -> None:
    out, model_name, strategy_json, global_batch, seq_len = sys.argv[1:6]
    global_batch, seq_len = int(global_batch), int(seq_len)
    strategy = DistributedStrategy.from_dict(json.loads(strategy_json))
    fleet = Fleet()
    fleet.init(is_collective=True, strategy=strategy)
    torch.manual_seed(0)
    model = sampan.models.create(model_name)
    vocab = model.config.vocab_size
    optimizer = sampan.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters(),
                                       grad_clip=sampan.nn.ClipGradByGlobalNorm(1.0))
    dmodel = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(optimizer)
    modules = list(dmodel._pipeline.modules) if dmodel._pipeline is not None else [dmodel.model]
    params = sum(local_bytes(p) for m in modules for p in m.parameters())
    batch = {"input_ids": torch.randint(0, vocab, (global_batch, seq_len)),
             "labels": torch.randint(0, vocab, (global_batch, seq_len))}
    dmodel.forward_backward(fleet.shard_batch(batch))
    inner = optimizer.torch_optimizer
    grads = sum(local_bytes(p.grad) for g in inner.param_groups for p in g["params"])
    optimizer.step()
    optim = sum(local_bytes(v) for state in inner.state.values() for v in state.values() if isinstance(v, torch.Tensor))
    rank = dist.get_rank()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"rank": rank, "params": params, "grads": grads,
                                                          "optimizer": optim}))
    env.shutdown()


if __name__ == "__main__":
    main()

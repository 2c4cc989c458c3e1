"""What each AMP level holds and sends: one training step of a tiny Llama per level, on the same ranks.

    torchrun --nproc_per_node 2 tests/scripts/precision_bytes.py OUT.json

For O1 (autocast over fp32 parameters) and the three O2 variants (bf16 parameters; master weights
and gradients on or off), rank 0 writes: the bytes of every all-gather and reduce-scatter of the
step (``CommCounter``), the dtype a matmul's weight has when the model computes, the dtypes of the
sharded parameters, gradients and optimizer state the optimizer sees, and the bytes of its
parameters and state.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import sampan
from sampan.distributed.comm_counter import CommCounter
from sampan.distributed.fleet import DistributedStrategy, Fleet

LEVELS = {
    "O1": {"level": "O1"},
    "O2": {"level": "O2"},
    "O2-no-master-grad": {"level": "O2", "use_master_grad": False},
    "O2-no-master-weight": {"level": "O2", "use_master_weight": False},
}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def one_step(amp_configs: dict) -> dict:
    torch.manual_seed(0)
    model = sampan.models.create("qwen2-tiny", vocab_size=64, hidden_size=32, num_layers=2, num_heads=4,
                                 num_kv_heads=2, intermediate_size=64, max_position_embeddings=16)
    strategy = DistributedStrategy(hybrid_configs={"sharding_degree": 2}, amp="bf16", amp_configs=amp_configs)
    fleet = Fleet().init(is_collective=True, strategy=strategy)
    optimizer = sampan.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
    dmodel = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(optimizer)
    compute = []
    probe = dmodel.model.model.layers[0].mlp.up_proj
    handle = probe.register_forward_pre_hook(lambda module, args: compute.append(str(module.weight.dtype)))
    ids = torch.randint(1, 64, (4, 16), generator=torch.Generator().manual_seed(1))
    # O1 needs autocast around the step, as the Trainer puts it; O2 computes in bf16 without it.
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if amp_configs["level"] == "O1" else torch.autocast(
        "cpu", enabled=False)
    with CommCounter() as comm, autocast:
        dmodel.train_batch(fleet.shard_batch({"input_ids": ids, "labels": ids}), optimizer)
    handle.remove()
    params = [p for g in optimizer.torch_optimizer.param_groups for p in g["params"]]
    state = [v for s in optimizer.torch_optimizer.state.values() for k, v in s.items()
             if isinstance(v, torch.Tensor) and k != "step"]
    totals = comm.totals()
    return {
        "all_gather_bytes": totals.get("all_gather", {}).get("payload_bytes", 0),
        "reduce_scatter_bytes": totals.get("reduce_scatter", {}).get("payload_bytes", 0),
        "compute_weight_dtype": compute[0],
        "param_dtypes": sorted({str(p.dtype) for p in params}),
        "state_dtypes": sorted({str(v.dtype) for v in state}),
        "param_bytes": sum(_local(p).numel() * _local(p).element_size() for p in params),
        "state_bytes": sum(_local(v).numel() * _local(v).element_size() for v in state),
        "param_count": sum(_local(p).numel() for p in params),
    }


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = {name: one_step(configs) for name, configs in LEVELS.items()}
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    from sampan.distributed.env import shutdown

    shutdown()


if __name__ == "__main__":
    main()

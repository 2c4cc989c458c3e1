"""The orders a user may call fleet's API in, trained side by side on one layout; rank 0 writes a report.

    torchrun --nproc_per_node 4 tests/scripts/fleet_api_order.py OUT.json --dp 2 --pp 2 --accumulate 2 \
        --orders before,after,seed [--errors]

Each order builds the tiny GPT and the AdamW of ``fleet_equivalence.py`` (same seed, same batches),
so its losses must equal that script's one-process run:

* ``before``: the optimizer over the original model's parameters, then ``distributed_model``,
  then ``distributed_optimizer(optimizer)`` (docs/distributed.md);
* ``after``: the README's snippet: the optimizer over ``distributed_model(...)``'s parameters;
* ``seed``: Paddle's documented order: ``fleet.init(is_collective=True)`` with no strategy, the
  strategy given only to ``distributed_optimizer(optimizer, strategy=...)``, then ``distributed_model``;
* ``seed-late``: ``fleet.init()``, ``distributed_model``, then ``distributed_optimizer(optimizer,
  strategy=...)`` with a strategy of fleet's default layout (pure data parallel).

Every order goes through the module-level ``fleet`` functions (``fleet.init`` starts over). ``--errors``
also records what the conflicting calls raise. The report holds, per order and rank, the losses,
whether the optimizer holds exactly the distributed model's parameters, and how many of them
training changed.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from fleet_equivalence import batches, make_model  # this script's folder is on sys.path

import sampan
from sampan.distributed import env, fleet


def make_optimizer(parameters):
    return sampan.optimizer.AdamW(learning_rate=1e-2, parameters=parameters, weight_decay=0.01,
                                  grad_clip=sampan.nn.ClipGradByGlobalNorm(1.0))


def local(p: torch.Tensor) -> torch.Tensor:
    return (p.to_local() if hasattr(p, "to_local") else p).detach().clone()


def strategy_of(args) -> fleet.DistributedStrategy:
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": args.dp, "mp_degree": args.mp, "pp_degree": args.pp}
    strategy.pipeline_configs = {"accumulate_steps": args.accumulate}
    return strategy


def build(order: str, args):
    """The distributed model and optimizer, set up in ``order``."""
    strategy = strategy_of(args)
    if order == "before":
        fleet.init(is_collective=True, strategy=strategy)
        model = make_model("gpt")
        optimizer = make_optimizer(model.parameters())
        model = fleet.distributed_model(model)
        optimizer = fleet.distributed_optimizer(optimizer)
    elif order == "after":  # the README's snippet, as written
        fleet.init(is_collective=True, strategy=strategy)
        model = fleet.distributed_model(make_model("gpt"))
        optimizer = fleet.distributed_optimizer(make_optimizer(model.parameters()))
    elif order == "seed":
        fleet.init(is_collective=True)
        model = make_model("gpt")
        optimizer = fleet.distributed_optimizer(make_optimizer(model.parameters()), strategy=strategy)
        model = fleet.distributed_model(model)
    elif order == "seed-late":
        fleet.init(is_collective=True)
        model = make_model("gpt")
        optimizer = make_optimizer(model.parameters())
        model = fleet.distributed_model(model)
        optimizer = fleet.distributed_optimizer(optimizer, strategy=strategy)
    else:
        raise ValueError(f"unknown order {order!r}")
    return model, optimizer


def train(order: str, args) -> dict:
    try:
        model, optimizer = build(order, args)
    except Exception as e:  # raised alike on every rank, before any collective could diverge
        return {"error": f"{type(e).__name__}: {e}"}
    params = list(model.parameters())
    held = [p for group in optimizer.param_groups for p in group["params"]]
    bound = len(held) == len(params) and {id(p) for p in held} == {id(p) for p in params}
    start = [local(p) for p in params]
    losses = [model.train_batch(fleet.shard_batch(batch), optimizer).item() for batch in batches("gpt")]
    changed = sum(not torch.equal(s, local(p)) for s, p in zip(start, params, strict=True))
    return {"losses": losses, "bound": bound, "changed": changed, "params": len(params)}


def expect_error(fn) -> str:
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return ""


def error_cases(args) -> dict:
    """What the conflicting calls raise ("" where nothing was raised)."""
    out = {}
    strategy = strategy_of(args)
    other = fleet.DistributedStrategy(hybrid_configs={"dp_degree": 1, "pp_degree": dist.get_world_size()},
                                      pipeline_configs={"accumulate_steps": 2})

    def two_strategies():
        fleet.init(is_collective=True, strategy=strategy)
        fleet.distributed_optimizer(make_optimizer(make_model("gpt").parameters()), strategy=other)

    def equal_strategies():  # the same layout given twice, as a separate but equal object
        fleet.init(is_collective=True, strategy=strategy)
        model = make_model("gpt")
        optimizer = make_optimizer(model.parameters())
        fleet.distributed_model(model)
        fleet.distributed_optimizer(optimizer, strategy=strategy_of(args))

    def model_split_under_the_default():
        fleet.init(is_collective=True)
        model = make_model("gpt")
        optimizer = make_optimizer(model.parameters())
        fleet.distributed_model(model)
        fleet.distributed_optimizer(optimizer, strategy=other)

    def topology_read_under_the_default():
        fleet.init(is_collective=True)
        fleet.get_hybrid_communicate_group()
        fleet.distributed_optimizer(make_optimizer(make_model("gpt").parameters()), strategy=other)

    for name, fn in (("two_strategies", two_strategies), ("equal_strategies", equal_strategies),
                     ("model_split_under_the_default", model_split_under_the_default),
                     ("topology_read_under_the_default", topology_read_under_the_default)):
        out[name] = expect_error(fn)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    for axis in ("dp", "mp", "pp"):
        parser.add_argument(f"--{axis}", type=int, default=1)
    parser.add_argument("--accumulate", type=int, default=1)
    parser.add_argument("--orders", default="before,after,seed")
    parser.add_argument("--errors", action="store_true", help="also record what conflicting calls raise")
    args = parser.parse_args()
    torch.set_num_threads(1)
    env.init_process_group()
    report: dict = {"orders": {}}
    for order in args.orders.split(","):
        result = train(order, args)
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result)
        report["orders"][order] = gathered
    if args.errors:
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, error_cases(args))
        report["errors"] = gathered
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    env.shutdown()


if __name__ == "__main__":
    main()

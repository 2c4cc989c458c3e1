"""Activation offload (``recompute_configs["enable_offload"]``): recomputed blocks keep their inputs
in host memory.

On this CPU-only machine the host is the device, so what offload saves is measured where it shows:
under ``sampan simulate``'s counting fake mode, which sends offloaded tensors to the meta device
and leaves them out of its device count. Gradients are checked on real tensors (the copy to the
host and back is a real copy here too), and at 8 gloo ranks in tests/test_fleet.py.
"""

from __future__ import annotations

import pytest
import torch

from sampan.distributed.simulate import CountingFakeMode
from sampan.distributed.strategy import DistributedStrategy
from sampan.models import create
from sampan.nn.recompute import apply_recompute, offload_host
from sampan.planner.hardware import get_hardware
from sampan.planner.layout import Layout, Workload, parse_fix
from sampan.planner.memory import offloaded_input_bytes, stage_memory
from sampan.planner.model_shape import load_model
from sampan.planner.time import step_time


@pytest.mark.parametrize("mode", ["full", "selective"])
@pytest.mark.parametrize("name", ["llama-tiny", "gpt-tiny"])
def test_offloaded_blocks_give_the_same_gradients(name, mode):
    torch.manual_seed(0)
    plain = create(name).train()
    offloaded = create(name).train()
    offloaded.load_state_dict(plain.state_dict())
    apply_recompute(plain, mode)
    assert apply_recompute(offloaded, mode, offload=True) == plain.config.num_layers
    ids = torch.randint(0, plain.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    plain(input_ids=ids, labels=ids).backward()
    offloaded(input_ids=ids, labels=ids).backward()
    for (key, a), b in zip(plain.named_parameters(), offloaded.parameters(), strict=True):
        assert b.grad is not None, key
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=1e-5, msg=key)


def _device_bytes_after_forward(offload: bool, batch: int, seq: int) -> tuple[int, bool]:
    """Live device bytes a llama-tiny forward leaves for backward, and whether the embedding still
    gets its gradient, under the simulation's counting fake mode."""
    mode = CountingFakeMode()
    with mode.counting(), offload_host("meta"):
        model = create("llama-tiny").train()
        apply_recompute(model, "full", offload=offload)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq))
        before = mode.live
        loss = model(input_ids=ids, labels=ids)
        held = mode.live - before
        loss.backward()
        embedding = next(p for name, p in model.named_parameters() if "embed" in name)
        embedding_grad = embedding.grad is not None
    return held, embedding_grad


def test_offload_takes_every_block_input_off_the_device_as_the_planner_says():
    batch, seq = 2, 16
    kept, grad_kept = _device_bytes_after_forward(False, batch, seq)
    offloaded, grad_offloaded = _device_bytes_after_forward(True, batch, seq)
    assert grad_kept and grad_offloaded  # the gradient reaches the layers below the offloaded inputs
    shape = load_model("llama-tiny")
    per_block = offloaded_input_bytes(shape, Layout(micro_batch=batch, recompute="full", offload=True),
                                      Workload(seq, batch, None))
    assert per_block == batch * seq * shape.hidden * 4  # the fp32 residual stream
    assert kept - offloaded == shape.layers * per_block


def test_offload_without_recompute_is_refused_everywhere():
    model = create("gpt-tiny")
    with pytest.raises(ValueError, match="needs recompute: set recompute to 'full'"):
        apply_recompute(model, "none", offload=True)
    strategy = DistributedStrategy(recompute_configs={"enable_offload": True})
    with pytest.raises(ValueError, match="set strategy.recompute = 'full'"):
        strategy.check_recompute()
    strategy.recompute = "full"
    strategy.check_recompute()
    with pytest.raises(ValueError, match="enable_offload must be True or False"):
        DistributedStrategy(recompute_configs={"enable_offload": "yes"})
    with pytest.raises(ValueError, match="offload keeps the inputs of recomputed blocks"):
        Layout(offload=True)


def test_the_strategy_carries_offload_through_plans_and_run_files():
    work = Workload(4096, 64, "bf16")
    layout = parse_fix("mp=8,pp=4,recompute=full,offload=true", 64, work)
    assert layout.offload and "offload" in layout.label()
    strategy = layout.to_strategy()
    assert strategy.recompute_configs.enable_offload and strategy.recompute == "full"
    assert DistributedStrategy.from_dict(strategy.to_dict()) == strategy
    # ... and back: what `sampan simulate` and `plan --from-run` read from a strategy is the layout.
    for fix in ("mp=8,pp=4,recompute=full,offload=true",
                "sharding=4,pp=4,cp=2,stage=3,schedule=interleaved,vpp=2,sp=true,amp=O2,master_grads=false"):
        layout = parse_fix(fix, 64, work)
        degrees = {"dp": layout.dp, "sharding": layout.sharding, "pp": layout.pp, "cp": layout.cp, "mp": layout.mp}
        assert Layout.from_strategy(layout.to_strategy().to_dict(), degrees, layout.micro_batch,
                                    layout.num_micro) == layout


def test_the_planner_prices_offload_as_less_memory_and_copy_time():
    """Llama 3 70B at t8 x p4 with full recompute: offload saves every block input the first stage
    keeps for its micro-batches in flight, and costs two copies of each over the host link."""
    shape, hw = load_model("llama3-70b"), get_hardware("h100-80g")
    work = Workload(8192, 64, "bf16")
    on = parse_fix("dp=2,mp=8,pp=4,micro_batch=1,recompute=full,offload=true", 64, work)
    off = parse_fix("dp=2,mp=8,pp=4,micro_batch=1,recompute=full", 64, work)
    per_block = offloaded_input_bytes(shape, on, work)
    layers = -(-shape.layers // 4)
    saved = stage_memory(shape, off, work, 0).total - stage_memory(shape, on, work, 0).total
    # Stage 0 holds pp = 4 micro-batches in flight; backward brings one block's input back.
    assert saved == pytest.approx((4 * layers - 1) * per_block, rel=1e-9)
    t_on, t_off = step_time(shape, on, work, hw), step_time(shape, off, work, hw)
    copies = on.num_micro * 2 * layers * per_block / (hw.host_gbps * 1e9)
    assert t_on.offload == pytest.approx(copies) and t_off.offload == 0
    assert t_on.total > t_off.total + copies  # and the bubble grows with the slower micro-batch

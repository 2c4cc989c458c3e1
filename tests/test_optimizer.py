"""sampan.optimizer and sampan.nn.clip: Paddle's API, torch.optim's numbers."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable

import pytest
import torch
from torch import nn

from sampan.nn.clip import ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue
from sampan.optimizer import SGD, Adam, AdamW, Momentum, Optimizer, lr


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.norm(self.fc1(x))))


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 4, generator=gen), torch.randn(16, 2, generator=gen)) for _ in range(n)]


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)


def no_decay(name: str) -> bool:
    return not (name.endswith("bias") or name.startswith("norm."))


def assert_same_params(a: nn.Module, b: nn.Module) -> None:
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name


# --- minimize, clear_grad, parameters found from the loss ----------------------------------------


def test_minimize_updates_parameters_and_zeroes_grads() -> None:
    model, ref = make_net(), make_net()
    ((x, y),) = batches(1)
    loss_of(ref, x, y).backward()
    expected = [torch.add(p.detach(), p.grad, alpha=-0.1) for p in ref.parameters()]

    opt = SGD(0.1, parameters=model.parameters())  # a generator: read once
    assert opt.minimize(loss_of(model, x, y)) is None

    for p, want in zip(model.parameters(), expected, strict=True):
        assert torch.equal(p.detach(), want)
        assert p.grad is None  # dropped, not zeroed (torch's default; see Optimizer.clear_grad)
    assert len(opt.param_groups[0]["params"]) == 6


def test_clear_grad_can_zero_grads_in_place() -> None:
    model = make_net()
    opt = SGD(0.1, parameters=model.parameters())
    ((x, y),) = batches(1)
    loss_of(model, x, y).backward()
    opt.clear_grad(set_to_zero=True)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
    opt.clear_grad()
    assert all(p.grad is None for p in model.parameters())


def test_adam_without_parameters_finds_them_in_the_loss_graph() -> None:
    torch.manual_seed(0)
    encoder, head = nn.Linear(3, 4), nn.Linear(4, 2)
    frozen = nn.Linear(3, 4).requires_grad_(False)
    scale = torch.ones(4, requires_grad=True)
    x = torch.randn(5, 3)

    def loss_fn() -> torch.Tensor:
        non_leaf = scale * 2.0  # requires grad but is not a leaf: must not be optimised
        hidden = torch.tanh(encoder(x) + frozen(x)) * non_leaf + encoder(x)  # encoder used twice
        return head(hidden).pow(2).mean()

    before = {name: p.detach().clone() for name, p in [("frozen", frozen.weight), ("enc", encoder.weight)]}
    opt = Adam(learning_rate=0.01)
    with pytest.raises(RuntimeError, match="parameters="):
        opt.step()
    opt.minimize(loss_fn())

    found = opt.param_groups[0]["params"]
    expected = [encoder.weight, encoder.bias, head.weight, head.bias, scale]
    assert len(found) == len(expected)
    assert {id(p) for p in found} == {id(p) for p in expected}
    assert all(p.is_leaf and p.requires_grad for p in found)
    assert torch.equal(frozen.weight, before["frozen"])
    assert not torch.equal(encoder.weight, before["enc"])
    # Adam's first step moves every parameter by about lr, whatever its gradient's size.
    assert torch.allclose(
        (encoder.weight - before["enc"]).abs(), torch.full_like(encoder.weight, 0.01), atol=1e-4
    )

    # The parameters stay fixed after the first minimize; later calls keep training them.
    opt.minimize(loss_fn())
    assert opt.param_groups[0]["params"] is found
    assert int(opt.torch_optimizer.state[encoder.weight]["step"]) == 2


def test_minimize_rejects_a_loss_without_graph() -> None:
    model = make_net()
    ((x, y),) = batches(1)
    with torch.no_grad():
        loss = loss_of(model, x, y)
    with pytest.raises(ValueError, match="grad_fn"):
        Adam(0.01).minimize(loss)


def test_lazy_optimizer_state_and_groups_need_parameters() -> None:
    opt = SGD(0.1)
    for action in (opt.state_dict, lambda: opt.param_groups, lambda: opt.torch_optimizer):
        with pytest.raises(RuntimeError, match="minimize"):
            action()
    opt.clear_grad()  # nothing to clear yet: not an error


# --- same numbers as torch.optim ------------------------------------------------------------------

Factory = Callable[[list[nn.Parameter]], object]
CASES: dict[str, tuple[Factory, Factory]] = {
    "sgd": (
        lambda p: SGD(0.1, parameters=p, weight_decay=0.01),
        lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.01),
    ),
    "momentum": (
        lambda p: Momentum(0.05, momentum=0.8, parameters=p, weight_decay=0.01),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, weight_decay=0.01),
    ),
    "nesterov": (
        lambda p: Momentum(0.05, parameters=p, use_nesterov=True),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    ),
    "adam": (
        lambda p: Adam(0.01, beta1=0.8, beta2=0.99, epsilon=1e-6, parameters=p, weight_decay=0.01),
        lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, fused=True),
    ),
    "adam-unfused": (
        lambda p: Adam(0.01, beta1=0.8, beta2=0.99, epsilon=1e-6, parameters=p, weight_decay=0.01, fused=False),
        lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01),
    ),
    "amsgrad": (
        lambda p: Adam(0.01, parameters=p, amsgrad=True),
        lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True, fused=True),
    ),
    "adamw": (
        lambda p: AdamW(0.01, parameters=p, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, fused=True),
    ),
    "adamw-unfused": (
        lambda p: AdamW(0.01, parameters=p, weight_decay=0.1, fused=False),
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_torch_optim_exactly(case: str) -> None:
    make_ours, make_torch = CASES[case]
    ours_model, torch_model = make_net(), make_net()
    ours, reference = make_ours(list(ours_model.parameters())), make_torch(list(torch_model.parameters()))
    for x, y in batches(5):
        ours.minimize(loss_of(ours_model, x, y))
        loss_of(torch_model, x, y).backward()
        reference.step()
        reference.zero_grad()
    assert_same_params(ours_model, torch_model)
    assert not torch.equal(ours_model.fc1.weight, make_net().fc1.weight)


def test_adam_weight_decay_is_coupled_and_adamw_decoupled() -> None:
    p = nn.Parameter(torch.tensor([1.0]))
    p.grad = torch.tensor([0.0])
    Adam(0.1, parameters=[p], weight_decay=0.5).step()
    assert p.item() == pytest.approx(0.9, abs=1e-6)  # gradient 0.5 -> Adam's normalised step of lr
    q = nn.Parameter(torch.tensor([1.0]))
    q.grad = torch.tensor([0.0])
    AdamW(0.1, parameters=[q], weight_decay=0.5).step()
    assert q.item() == pytest.approx(1.0 - 0.1 * 0.5)  # only the decay moves it


def test_adamw_apply_decay_param_fun_excludes_biases_and_layernorm() -> None:
    ours_model, torch_model = make_net(), make_net()
    ours = AdamW(
        0.01, parameters=ours_model.named_parameters(), weight_decay=0.1, apply_decay_param_fun=no_decay
    )

    decay_group, plain_group = ours.param_groups
    assert decay_group["weight_decay"] == 0.1 and plain_group["weight_decay"] == 0.0
    assert decay_group["params"] == [ours_model.fc1.weight, ours_model.fc2.weight]
    assert plain_group["params"] == [
        ours_model.fc1.bias,
        ours_model.norm.weight,
        ours_model.norm.bias,
        ours_model.fc2.bias,
    ]

    named = dict(torch_model.named_parameters())
    reference = torch.optim.AdamW(
        [
            {"params": [p for n, p in named.items() if no_decay(n)], "weight_decay": 0.1},
            {"params": [p for n, p in named.items() if not no_decay(n)], "weight_decay": 0.0},
        ],
        lr=0.01,
        fused=True,
    )
    for x, y in batches(4):
        ours.minimize(loss_of(ours_model, x, y))
        loss_of(torch_model, x, y).backward()
        reference.step()
        reference.zero_grad()
    assert_same_params(ours_model, torch_model)


def test_apply_decay_param_fun_needs_names() -> None:
    model = make_net()
    with pytest.raises(ValueError, match="named_parameters"):
        AdamW(parameters=model.parameters(), apply_decay_param_fun=no_decay)
    with pytest.raises(ValueError, match="named_parameters"):
        AdamW(apply_decay_param_fun=no_decay)


def test_param_group_learning_rate_is_a_multiplier() -> None:
    model, ref = make_net(), make_net()
    ((x, y),) = batches(1)
    loss_of(ref, x, y).backward()

    opt = SGD(
        0.1,
        parameters=[
            {"params": model.fc1.parameters(), "learning_rate": 0.5},
            {"params": list(model.norm.parameters()) + list(model.fc2.parameters()), "weight_decay": 0.0},
        ],
    )
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(0.05), pytest.approx(0.1)]
    opt.minimize(loss_of(model, x, y))
    assert torch.equal(model.fc1.weight, torch.add(ref.fc1.weight, ref.fc1.weight.grad, alpha=-0.05))
    assert torch.equal(model.fc2.weight, torch.add(ref.fc2.weight, ref.fc2.weight.grad, alpha=-0.1))

    opt.set_lr(0.2)
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(0.1), pytest.approx(0.2)]


# --- gradient clipping ----------------------------------------------------------------------------


def grads_of(model: nn.Module, seed: int = 0) -> nn.Module:
    ((x, y),) = batches(1, seed=seed)
    (loss_of(model, x, y) * 50.0).backward()  # large gradients, so clipping bites
    return model


def test_clip_by_global_norm_matches_torch() -> None:
    ours, ref = grads_of(make_net()), grads_of(make_net())
    norm = ClipGradByGlobalNorm(0.5)(ours.parameters())
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    assert norm.item() > 0.5 and torch.equal(norm, ref_norm)
    for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ours.parameters()]))
    assert clipped.item() <= 0.5


def test_optimizer_applies_grad_clip_before_the_update() -> None:
    ours_model, torch_model = make_net(), make_net()
    ours = Momentum(0.1, parameters=ours_model.parameters(), grad_clip=ClipGradByGlobalNorm(0.3))
    reference = torch.optim.SGD(torch_model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches(3):
        ours.minimize(loss_of(ours_model, x, y) * 50.0)
        (loss_of(torch_model, x, y) * 50.0).backward()
        torch.nn.utils.clip_grad_norm_(torch_model.parameters(), 0.3)
        reference.step()
        reference.zero_grad()
    assert_same_params(ours_model, torch_model)


def test_clip_by_norm_clips_each_tensor_separately() -> None:
    model, ref = grads_of(make_net()), grads_of(make_net())
    assert ClipGradByNorm(0.2)(model.parameters()) is None
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        norm = q.grad.norm()
        want = q.grad * (0.2 / (norm + 1e-6)) if norm > 0.2 else q.grad
        assert torch.allclose(p.grad, want, rtol=1e-6, atol=0)
        assert p.grad.norm().item() <= 0.2 + 1e-6
    assert any(q.grad.norm() > 0.2 for q in ref.parameters())


def test_clip_by_value() -> None:
    model, ref = grads_of(make_net()), grads_of(make_net())
    ClipGradByValue(0.1, min=-0.05)(model.parameters())
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad.clamp(-0.05, 0.1))
    symmetric = ClipGradByValue(0.01)
    assert (symmetric.min, symmetric.max) == (-0.01, 0.01)
    symmetric(model.parameters())
    assert max(p.grad.abs().max().item() for p in model.parameters()) == pytest.approx(0.01)


def test_clip_skips_parameters_without_grad() -> None:
    p, q = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 4.0)
    norm = ClipGradByGlobalNorm(1.0)([p, q])
    assert norm.item() == pytest.approx(48**0.5) and q.grad is None
    assert p.grad.norm().item() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: ClipGradByGlobalNorm(0.0), "clip_norm"),
        (lambda: ClipGradByNorm(-1.0), "clip_norm"),
        (lambda: ClipGradByValue(-1.0), "max"),
        (lambda: ClipGradByValue(1.0, min=2.0), "min must be < max"),
    ],
)
def test_clip_validation(make: Callable[[], object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()


# --- learning rate ----------------------------------------------------------------------------------


def test_get_lr_and_set_lr() -> None:
    model = make_net()
    opt = Adam(0.01, parameters=model.parameters())
    assert opt.get_lr() == 0.01
    opt.set_lr(0.002)
    assert opt.get_lr() == 0.002 and opt.param_groups[0]["lr"] == 0.002
    with pytest.raises(ValueError, match=r"learning_rate must be in \[0, inf\)"):
        opt.set_lr(-1.0)

    scheduled = Adam(lr.ConstantLR(0.01), parameters=model.parameters())
    with pytest.raises(RuntimeError, match="LRScheduler"):
        scheduled.set_lr(0.1)


def test_scheduler_sets_the_learning_rate_used_by_each_step() -> None:
    model = make_net()
    scheduler = lr.LinearWarmup(0.1, warmup_steps=2, start_lr=0.0, end_lr=0.1)
    opt = SGD(scheduler, parameters=model.parameters())
    weight = model.fc1.weight
    used = []
    for x, y in batches(4):
        loss_of(model, x, y).backward()
        before, grad = weight.detach().clone(), weight.grad.clone()
        opt.step()
        opt.clear_grad()
        used.append(opt.param_groups[0]["lr"])
        assert torch.equal(weight.detach(), torch.add(before, grad, alpha=-used[-1]))
        scheduler.step()
    assert used == [0.0, pytest.approx(0.05), pytest.approx(0.1), pytest.approx(0.1)]
    assert opt.get_lr() == pytest.approx(0.1)


# --- checkpoints -----------------------------------------------------------------------------------


def test_state_dict_round_trip_with_scheduler_continues_identically() -> None:
    def build(model: nn.Module) -> tuple[Optimizer, lr.LRScheduler]:
        scheduler = lr.WarmupStableDecay(
            0.01, warmup_steps=2, stable_steps=1, decay_steps=4, decay_type="cosine"
        )
        opt = AdamW(scheduler, parameters=model.named_parameters(), apply_decay_param_fun=no_decay)
        return opt, scheduler

    data = batches(8)
    model_a = make_net()
    opt_a, sched_a = build(model_a)
    for x, y in data[:4]:
        opt_a.minimize(loss_of(model_a, x, y))
        sched_a.step()

    # torch's state_dict shares tensors with the live state, so snapshot copies.
    saved_weights = copy.deepcopy(model_a.state_dict())
    saved_opt = copy.deepcopy(opt_a.state_dict())
    saved_opt["lr_scheduler"] = json.loads(json.dumps(saved_opt["lr_scheduler"]))

    model_b = make_net(seed=123)
    model_b.load_state_dict(saved_weights)
    opt_b, sched_b = build(model_b)
    opt_b.set_state_dict(saved_opt)
    assert sched_b.last_epoch == 4 and opt_b.get_lr() == opt_a.get_lr()

    for x, y in data[4:]:
        for model, opt, sched in ((model_a, opt_a, sched_a), (model_b, opt_b, sched_b)):
            opt.minimize(loss_of(model, x, y))
            sched.step()
    assert_same_params(model_a, model_b)
    assert opt_b.get_lr() == opt_a.get_lr() == 0.0


def test_state_dict_round_trip_with_float_lr() -> None:
    data = batches(6)
    model_a, model_b = make_net(), make_net()
    opt_a = Momentum(0.1, parameters=model_a.parameters())
    for x, y in data[:3]:
        opt_a.minimize(loss_of(model_a, x, y))
    opt_a.set_lr(0.05)

    model_b.load_state_dict(model_a.state_dict())
    opt_b = Momentum(0.1, parameters=model_b.parameters())
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    assert opt_b.get_lr() == 0.05

    for x, y in data[3:]:
        opt_a.minimize(loss_of(model_a, x, y))
        opt_b.minimize(loss_of(model_b, x, y))
    assert_same_params(model_a, model_b)

    scheduled = Momentum(lr.ConstantLR(0.1), parameters=make_net().parameters())
    with pytest.raises(ValueError, match="lr_scheduler"):
        scheduled.set_state_dict(opt_a.state_dict())


# --- validation -------------------------------------------------------------------------------------


def params() -> list[nn.Parameter]:
    return list(make_net().parameters())


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: SGD(-0.1, parameters=params()), ValueError, r"learning_rate must be in \[0, inf\)"),
        (lambda: SGD("0.1", parameters=params()), TypeError, "learning_rate"),
        (lambda: SGD(0.1, parameters=params(), weight_decay=-1.0), ValueError, "weight_decay"),
        (lambda: Adam(beta1=1.0), ValueError, r"beta1 must be in \[0, 1\)"),
        (lambda: Adam(beta2=-0.1), ValueError, r"beta2 must be in \[0, 1\)"),
        (lambda: AdamW(epsilon=0.0), ValueError, r"epsilon must be in \(0, inf\)"),
        (lambda: Momentum(momentum=-0.5), ValueError, "momentum"),
        (lambda: Momentum(momentum=0.0, use_nesterov=True), ValueError, "use_nesterov"),
        (lambda: SGD(grad_clip=1.0), TypeError, "grad_clip must be callable"),
        (lambda: SGD(parameters=[]), ValueError, "parameters is empty"),
        (lambda: SGD(parameters=[1, 2]), TypeError, "parameters must hold tensors"),
        (lambda: SGD(parameters=[{"params": params(), "lr": 0.1}]), ValueError, r"unknown key\(s\) \['lr'\]"),
        (lambda: SGD(parameters=[{"weight_decay": 0.1}]), ValueError, "no 'params'"),
        (
            lambda: SGD(parameters=[{"params": params(), "learning_rate": -1.0}]),
            ValueError,
            "param group 0 'learning_rate'",
        ),
    ],
)
def test_validation_errors(make: Callable[[], object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_adam_defaults_to_the_fused_kernel_for_plain_cpu_tensors() -> None:
    params = [nn.Parameter(torch.randn(3, 3))]
    assert AdamW(0.01, parameters=params).torch_optimizer.defaults["fused"] is True
    assert not AdamW(0.01, parameters=params, fused=False).torch_optimizer.defaults["fused"]

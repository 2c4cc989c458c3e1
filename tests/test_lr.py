"""sampan.optimizer.lr: values at given steps, computed by hand, and JSON-safe state."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest

from sampan.optimizer import lr


def values(scheduler: lr.LRScheduler, n: int) -> list[float]:
    """LRs for steps 0 .. n-1, stepping the way a training loop does."""
    out = []
    for _ in range(n):
        out.append(scheduler())
        scheduler.step()
    return out


COS_QUARTER = (1 + math.cos(math.pi / 4)) / 2  # 0.853553...
COS_THREE_QUARTERS = (1 + math.cos(3 * math.pi / 4)) / 2  # 0.146446...


def test_construction_steps_once_to_step_zero() -> None:
    scheduler = lr.LinearDecay(1.0, total_steps=4)
    assert scheduler.last_epoch == 0 and scheduler.last_lr == 1.0 and scheduler() == 1.0
    resumed = lr.LinearDecay(1.0, total_steps=4, last_epoch=1)
    assert resumed.last_epoch == 2 and resumed() == pytest.approx(0.5)


def test_constant() -> None:
    assert values(lr.ConstantLR(0.3), 3) == [0.3, 0.3, 0.3]


def test_linear_warmup_to_a_float() -> None:
    scheduler = lr.LinearWarmup(0.5, warmup_steps=4, start_lr=0.1, end_lr=0.5)
    assert values(scheduler, 6) == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.5])


def test_linear_warmup_drives_a_wrapped_scheduler() -> None:
    inner = lr.CosineAnnealingDecay(1.0, T_max=4)
    scheduler = lr.LinearWarmup(inner, warmup_steps=2, start_lr=0.0, end_lr=1.0)
    assert values(scheduler, 8) == pytest.approx(
        [0.0, 0.5, 1.0, COS_QUARTER, 0.5, COS_THREE_QUARTERS, 0.0, 0.0]
    )
    assert scheduler.last_epoch == 8 and inner.last_epoch == 8 - 2


def test_linear_warmup_with_zero_steps_is_the_schedule_itself() -> None:
    scheduler = lr.LinearWarmup(lr.LinearDecay(1.0, total_steps=2), warmup_steps=0, start_lr=0.0, end_lr=1.0)
    assert values(scheduler, 3) == pytest.approx([1.0, 0.5, 0.0])


def test_linear_decay() -> None:
    scheduler = lr.LinearDecay(1.0, total_steps=4, end_lr=0.2)
    assert values(scheduler, 6) == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2])


def test_cosine_annealing() -> None:
    scheduler = lr.CosineAnnealingDecay(1.0, T_max=4, eta_min=0.2)
    expected = [1.0, 0.2 + 0.8 * COS_QUARTER, 0.6, 0.2 + 0.8 * COS_THREE_QUARTERS, 0.2, 0.2]
    assert values(scheduler, 6) == pytest.approx(expected)
    assert expected[1] == pytest.approx(0.882843, abs=1e-6)
    scheduler.step(2)  # closed form: jumping to a step gives that step's value
    assert scheduler.last_epoch == 2 and scheduler() == pytest.approx(0.6)
    scheduler.step(1000)
    assert scheduler() == 0.2


@pytest.mark.parametrize(
    ("decay_type", "decaying"),
    [
        ("linear", [1.0, 0.8, 0.6, 0.4]),
        ("cosine", [1.0, 0.2 + 0.8 * COS_QUARTER, 0.6, 0.2 + 0.8 * COS_THREE_QUARTERS]),
        ("sqrt", [1.0, 0.6, 0.2 + 0.8 * (1 - math.sqrt(0.5)), 0.2 + 0.8 * (1 - math.sqrt(0.75))]),
    ],
)
def test_warmup_stable_decay(decay_type: str, decaying: list[float]) -> None:
    scheduler = lr.WarmupStableDecay(
        1.0, warmup_steps=2, stable_steps=2, decay_steps=4, min_lr=0.2, start_lr=0.0, decay_type=decay_type
    )
    warmup, stable, after = [0.0, 0.5], [1.0, 1.0], [0.2, 0.2]
    assert values(scheduler, 10) == pytest.approx(warmup + stable + decaying + after)


def test_custom_scheduler_and_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    class Halving(lr.LRScheduler):
        def get_lr(self) -> float:
            return self.base_lr * 0.5**self.last_epoch

    scheduler = Halving(1.0, verbose=True)
    assert values(scheduler, 3) == [1.0, 0.5, 0.25]
    assert "Epoch 2: Halving set learning rate to 0.25." in capsys.readouterr().out

    with pytest.raises(NotImplementedError, match="get_lr"):
        lr.LRScheduler(0.1)


def test_state_dict_is_json_and_resumes_identically() -> None:
    def build() -> lr.LRScheduler:
        return lr.LinearWarmup(
            lr.CosineAnnealingDecay(1.0, T_max=5, eta_min=0.1), 3, start_lr=0.0, end_lr=1.0
        )

    original = build()
    values(original, 5)
    state = original.state_dict()
    restored_state = json.loads(json.dumps(state))
    assert restored_state == state
    assert state["last_epoch"] == 5 and state["last_lr"] == original()
    assert state["learning_rate"]["last_epoch"] == 5 - 3  # the wrapped schedule's own progress

    resumed = build()
    resumed.load_state_dict(restored_state)
    assert resumed.last_epoch == 5 and resumed() == original()
    assert values(resumed, 6) == values(original, 6)

    with pytest.raises(KeyError, match="last_epoch"):
        build().set_state_dict({"last_lr": 0.1})


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: lr.ConstantLR(-0.1), ValueError, r"learning_rate must be in \[0, inf\)"),
        (
            lambda: lr.LinearWarmup(0.1, warmup_steps=-1, start_lr=0.0, end_lr=0.1),
            ValueError,
            "warmup_steps must be an int >= 0",
        ),
        (
            lambda: lr.LinearWarmup(0.1, warmup_steps=2.5, start_lr=0.0, end_lr=0.1),
            TypeError,
            "warmup_steps must be an int",
        ),
        (lambda: lr.LinearWarmup(0.1, warmup_steps=2, start_lr=-1.0, end_lr=0.1), ValueError, "start_lr"),
        (lambda: lr.CosineAnnealingDecay(0.1, T_max=0), ValueError, "T_max must be an int >= 1"),
        (lambda: lr.CosineAnnealingDecay(0.1, T_max=4, eta_min=-0.1), ValueError, "eta_min"),
        (lambda: lr.LinearDecay(0.1, total_steps=0), ValueError, "total_steps must be an int >= 1"),
        (lambda: lr.WarmupStableDecay(0.1, 1, -1, 1), ValueError, "stable_steps must be an int >= 0"),
        (lambda: lr.WarmupStableDecay(0.1, 1, 1, -1), ValueError, "decay_steps must be an int >= 0"),
        (
            lambda: lr.WarmupStableDecay(0.1, 1, 1, 1, decay_type="exp"),
            ValueError,
            r"decay_type must be one of \('linear', 'cosine', 'sqrt'\), got 'exp'",
        ),
        (lambda: lr.ConstantLR(0.1, last_epoch=-2), ValueError, "last_epoch must be an int >= -1"),
    ],
)
def test_validation_errors(make: Callable[[], object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_step_rejects_a_negative_epoch() -> None:
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        lr.ConstantLR(0.1).step(-3)

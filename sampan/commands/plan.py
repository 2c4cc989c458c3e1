"""``sampan plan``: the auto-parallel planner on paper (flags and run in ``sampan.planner.command``).
Torch-free: ``sampan plan`` answers in about a second."""

from __future__ import annotations

import argparse

from sampan.commands import arguments_later, set_handler


def _arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.planner.command import add_arguments

    add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from sampan.planner.command import run

    return run(args)


def register(subparsers) -> None:
    plan = subparsers.add_parser(
        "plan", help="choose dp / mp / pp / sharding / micro-batch / recompute for a model on a cluster (on paper)",
        description="Search every valid hybrid-parallel layout of a model on N GPUs, predict memory per GPU and step "
                    "time from closed forms (ZeRO state, Korthikanti activations, alpha-beta collectives, pipeline "
                    "bubble), and rank them. --fix prices one layout; --write-strategy writes a run file for "
                    "`sampan train`. Formulas and their validation: docs/planner.md.",
        epilog="example:  sampan plan --model gpt-175b --gpus 1024 --hardware a100-80g --seq-len 2048 "
               "--global-batch 1536 --top 10")
    arguments_later(plan, _arguments)
    set_handler(plan, run)

"""The ``sampan`` verbs, one module each (``sampan/commands/<verb>.py``, as accelerate's
``commands/``). Each exposes ``register(subparsers)``: it adds its parser and sets its handler;
``sampan.cli`` builds the top parser, registers them in ``COMMANDS`` order and dispatches.

A module imports nothing heavy at its top: building the whole parser (``sampan --help``,
``sampan plan``) imports no torch. A verb whose flags come from a config that lives beside torch
(the demo, ``pretrain``, ``data build``) adds them with ``arguments_later``: they are added when
that verb's parser first parses or prints its help, so only the verb that runs pays for them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

# The order of ``sampan --help``.
COMMANDS = ("demo", "data", "pretrain", "hub", "task", "finetune", "export", "train", "report", "models",
            "launch", "plan", "simulate", "bench", "serve")

Handler = Callable[[argparse.Namespace], int]

# More optional flags than this (a verb whose config nests TrainingArguments has about 50) and the
# usage line lists only the required ones; --help still shows every flag, grouped by config.
SHORT_USAGE_ABOVE = 24


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that can add some of its arguments on first use (``arguments_later``).
    Its sub-parsers are Parsers too (argparse makes them of the parent's class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: list[Callable[[argparse.ArgumentParser], None]] = []

    def add_later(self, add_arguments: Callable[[argparse.ArgumentParser], None]) -> None:
        self._pending.append(add_arguments)

    def populate(self) -> None:
        """Add the deferred arguments now; a verb with many flags (a nested config's) gets a short
        usage line naming only what it requires, the rest being under ``--help``."""
        while self._pending:
            self._pending.pop(0)(self)
        if self.usage is None and sum(1 for a in self._actions if a.option_strings) > SHORT_USAGE_ABOVE:
            needed = [a.metavar or a.dest.upper() for a in self._actions if not a.option_strings
                      and a.help != argparse.SUPPRESS]
            needed += [f"{a.option_strings[0]} {a.metavar or a.dest.upper()}" for a in self._actions
                       if a.option_strings and a.required]
            self.usage = " ".join(["%(prog)s", *needed, "[options]"])

    def parse_known_args(self, args=None, namespace=None):
        self.populate()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.populate()
        return super().format_help()

    def format_usage(self) -> str:
        self.populate()
        return super().format_usage()


def arguments_later(parser: argparse.ArgumentParser, add_arguments: Callable[[argparse.ArgumentParser], None]) -> None:
    """``add_arguments(parser)`` when ``parser`` first parses or prints help (now, for a plain
    ``ArgumentParser``)."""
    if isinstance(parser, Parser):
        parser.add_later(add_arguments)
    else:
        add_arguments(parser)


def set_handler(parser: argparse.ArgumentParser, handler: Handler) -> None:
    """The function ``sampan.cli.main`` calls with the parsed namespace when this parser's verb runs,
    and the name its errors are reported under (``sampan data build: error: ...``)."""
    parser.set_defaults(func=handler, command=parser.prog)

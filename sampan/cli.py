"""``sampan <verb>``: the command line. Each verb is a module of ``sampan.commands`` that registers its
parser and handler; this builds the top parser, registers them and dispatches. Building the parser
imports no torch (``sampan --help`` and ``sampan plan`` start in about a second).

A user error (a ``ValueError``, a missing or existing file, ... that sampan raises for bad input)
ends the command with one line, ``sampan VERB: error: ...``, on stderr and exit status 2; set
``SAMPAN_DEBUG=1`` to get the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from sampan.commands import COMMANDS, Parser

# What sampan raises for bad input: reported in one line with status 2. (ConnectionError: the
# network failed, not the input; one line too, status 1.)
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError)


def build_parser() -> argparse.ArgumentParser:
    from sampan._version import __version__

    parser = Parser(prog="sampan", description="Sampan: train, scale and ship Chinese LLMs.")
    parser.add_argument("--version", action="version", version=f"sampan {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    for name in COMMANDS:
        importlib.import_module(f"sampan.commands.{name}").register(verbs)
    return parser


def _debug() -> bool:
    return os.environ.get("SAMPAN_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (*USER_ERRORS, ConnectionError) as err:
        if _debug():
            raise
        print(f"{args.command}: error: {err}", file=sys.stderr)
        return 1 if isinstance(err, ConnectionError) else 2


if __name__ == "__main__":
    raise SystemExit(main())

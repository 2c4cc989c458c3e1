"""Plant each bug of ``tests/mutants/mutations.py`` in a copy of the repository and check the suite catches it.

    python -m tests.mutants.run                 # every mutation (minutes each: it runs real tests)
    python -m tests.mutants.run --only NAME     # one; --list shows them

For each mutation the repository (sources, tests, examples, benchmarks, pyproject) is copied to a
temporary directory, the edit is applied there, and the mutation's tests run from the copy with
``PYTHONPATH`` pointing at it (subprocesses the tests start inherit it, so torchrun workers run
the mutated code too). Caught means pytest exits non-zero. The real tree is never edited. Exits 1
when any mutation survives, naming it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.mutants.mutations import MUTATIONS, Mutation

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("sampan", "tests", "examples", "benchmarks", "docs", "pyproject.toml", "Makefile", "README.md")


def _copy_tree(target: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, ignore=ignore, symlinks=True)
        else:
            shutil.copy2(source, target / name)


def plant(mutation: Mutation, tree: Path) -> None:
    """Apply ``mutation`` to the copy at ``tree``; its ``old`` text must occur exactly once."""
    path = tree / mutation.path
    text = path.read_text(encoding="utf-8")
    count = text.count(mutation.old)
    if count != 1:
        raise ValueError(f"mutation {mutation.name}: the text to replace occurs {count} times in {mutation.path} "
                         "(it must occur once; the code moved on: update tests/mutants/mutations.py)")
    path.write_text(text.replace(mutation.old, mutation.new), encoding="utf-8")


def run_one(mutation: Mutation, timeout: int) -> tuple[bool, float, str]:
    """(caught, seconds, last lines of pytest's output)."""
    with tempfile.TemporaryDirectory(prefix=f"sampan-mutant-{mutation.name}-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        plant(mutation, tree)
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutation.tests]
        start = time.perf_counter()
        try:
            done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
            caught, output = done.returncode != 0, done.stdout[-1500:] + done.stderr[-500:]
        except subprocess.TimeoutExpired:
            caught, output = True, f"timed out after {timeout} s (counted as caught: the suite did not pass)"
        return caught, time.perf_counter() - start, output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="run this mutation (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=int, default=1200, help="seconds per mutation (default: 1200)")
    parser.add_argument("--show", action="store_true", help="print how each caught bug failed, too")
    args = parser.parse_args(argv)
    names = {m.name for m in MUTATIONS}
    unknown = sorted(set(args.only) - names)
    if unknown:
        parser.error(f"unknown mutation(s) {unknown}; known: {sorted(names)}")
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:36s} {m.path}\n    {m.why}")
        return 0
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    survivors = []
    for m in chosen:
        caught, seconds, output = run_one(m, args.timeout)
        print(f"{'caught  ' if caught else 'SURVIVED'} {m.name:36s} {seconds:6.0f} s")
        if not caught:
            survivors.append(m.name)
        if not caught or args.show:
            print("    " + output.strip().replace("\n", "\n    "))
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} planted bugs caught")
    if survivors:
        print(f"survived (test gaps): {', '.join(survivors)}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())

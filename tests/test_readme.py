"""The README stays a page a newcomer reads in two minutes, and every link in it leads somewhere real.

The README is short on purpose: what sampan is, the two commands to run on a fresh machine, a
quickstart, one line per area and links into docs/. Figures live in docs/benchmarks.md (rendered from
their runs, see tests/test_readme_figures.py), evidence in each area's doc. These checks keep it
that way: a length bound, a line-width bound, the commands near the top, and links that resolve to
files inside the repository (no ``../`` that only works beside some other checkout, no absolute
paths of one machine). Cost: well under a second (text only).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAX_LINES = 140  # 150 with the OCR and layout tables, which live in docs/benchmarks.md
MAX_LINE_CHARS = 200
COMMANDS_WITHIN = 15  # lines from the top in which `make demo` and `make test` must appear

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)
# A path on one machine's disk outside any checkout: /work/..., /home/..., C:\... (``~/.sampan``, the
# user's own sampan home, is where sampan writes, not a link, so it is allowed).
_ABSOLUTE = re.compile(r"(?:^|[\s(`'\"])(?:/(?:work|home|root|Users|mnt|srv)/|[A-Za-z]:\\)")
# Repository paths named in code spans, e.g. `docs/jit.md` or `examples/configs/gpt_tiny_sanguo.toml`.
_REPO_PATH = re.compile(r"^(?:docs|examples|benchmarks|tests|sampan)/[\w./-]*\.\w+$")


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", text)


def _anchors(markdown: str) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", markdown, re.M)}


def link_problems(text: str, where: Path, root: Path = ROOT) -> list[str]:
    """Every relative link (and repository path in a code span) in ``text``, a file in ``where``,
    that does not lead to a file or folder inside ``root``, or to a heading of that file."""
    problems = []
    if "../" in text:
        problems.append("a path climbs out with '../': link inside the repository instead")
    for match in _ABSOLUTE.finditer(text):
        problems.append(f"an absolute path of one machine: {text[match.start():match.start() + 40].strip()!r}")
    for target in _LINK.findall(text):
        if _SCHEME.match(target):
            continue  # a web address (http, https, mailto): not a file of this repository
        path_part, _, anchor = target.partition("#")
        if path_part.startswith("/"):
            problems.append(f"link {target!r} is an absolute path: make it relative to {where.name}")
            continue
        resolved = (where.parent / path_part).resolve() if path_part else where.resolve()
        if not resolved.is_relative_to(root.resolve()):
            problems.append(f"link {target!r} leaves the repository")
        elif not resolved.exists():
            problems.append(f"link {target!r} names no file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved.read_text(encoding="utf-8")):
            problems.append(f"link {target!r}: {resolved.name} has no heading with the anchor #{anchor}")
    for span in _CODE_SPAN.findall(text):
        if _REPO_PATH.match(span) and not (root / span).exists():
            problems.append(f"`{span}` names no file in the repository")
    return problems


def readme_problems(text: str, where: Path = ROOT / "README.md", root: Path = ROOT) -> list[str]:
    """What keeps ``text`` from being a README a newcomer reads in two minutes (empty when none)."""
    lines = text.splitlines()
    problems = []
    if len(lines) > MAX_LINES:
        problems.append(f"{len(lines)} lines, more than {MAX_LINES}: move detail into docs/")
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_CHARS:
            problems.append(f"line {number} has {len(line)} characters, more than {MAX_LINE_CHARS}")
    top = "\n".join(lines[:COMMANDS_WITHIN])
    for command in ("make demo", "make test"):
        if not re.search(rf"^{command}\b", top, re.M):
            problems.append(f"`{command}` is not a command line in the first {COMMANDS_WITHIN} lines")
    return problems + link_problems(text, where, root)


def test_readme_is_short_starts_with_the_commands_and_links_inside_the_repository():
    problems = readme_problems((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not problems, "README.md:\n" + "\n".join(problems)


def test_benchmarks_page_links_resolve():
    page = ROOT / "docs" / "benchmarks.md"
    problems = link_problems(page.read_text(encoding="utf-8"), page)
    assert not problems, "docs/benchmarks.md:\n" + "\n".join(problems)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """Each rule fires on a README that breaks it, and only that rule (a rule that never fires
    would pass any README)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Figures that trace back to a run\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    good = ("# X\n\n```bash\nmake demo\nmake test\n```\n\n[a](docs/a.md), [b](docs/a.md#figures-that-trace-back-to-a-run), "
            "[web](https://pytorch.org), `docs/a.md`\n")
    assert readme_problems(good, readme, tmp_path) == []

    def only(text: str, expected: str) -> None:
        problems = readme_problems(text, readme, tmp_path)
        assert len(problems) == 1 and expected in problems[0], problems

    only(good + "x\n" * MAX_LINES, "lines, more than")
    only(good + "y" * (MAX_LINE_CHARS + 1) + "\n", "characters, more than")
    only(good.replace("make demo\n", "") + "text\n" * COMMANDS_WITHIN + "```bash\nmake demo\n```\n",
         "`make demo` is not a command line")
    only(good + "[missing](docs/b.md)\n", "names no file")
    only(good + "[anchor](docs/a.md#no-such-heading)\n", "no heading with the anchor")
    only(good + "`docs/b.md`\n", "`docs/b.md` names no file")
    only(good + "[abs](/etc/hosts)\n", "is an absolute path")
    only(good + "notes: /work/shared/NOTES.md\n", "absolute path of one machine")
    outside = readme_problems(good + "[up](../shared/DESIGN.md)\n", readme, tmp_path)
    assert any("'../'" in p for p in outside) and any("leaves the repository" in p for p in outside), outside

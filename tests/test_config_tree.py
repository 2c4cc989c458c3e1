"""One configuration tree: every verb's flags come from its config dataclass, and each setting is
declared once (docs/configuration.md). Cost: about 5 s (the parser is built once, every verb's
flags are added, and the configs are walked; no model is built)."""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict

import pytest

from sampan import cli
from sampan.commands import Parser
from sampan.utils.config import build, config_classes, leaves, nested, resolve_nested

# A word that names a different setting in each class listed, with what it is there. The check
# below compares this table with the code both ways: a new class declaring one of these words (or
# any other word twice) fails until it nests the owner, or the difference is argued here.
HOMONYMS: dict[str, dict[str, str]] = {
    "device": {
        "TrainingArguments": "where a run trains (the model, the optimizer state and the batches live there)",
        "ServeSpec": "where a server's predictors run (ONNX Runtime's provider, or torch's for .pt2)",
        "TaskOptions": "where one Taskflow's predictor runs",
        "ExportOptions": "where the exported programs are checked against eager (export itself traces on the CPU)",
        "CommBenchOptions": "which collectives backend the benchmark times (cpu: gloo, cuda: NCCL)",
    },
    "model": {
        "FinetuneConfig": "the base to start from: a model directory, a stored model's name, or a config name",
        "TaskOptions": "the stored model or directory a task runs",
        "Job": "the model planned or simulated: a registered name or a config file (no weights)",
        "PretrainConfig": "the registered ERNIE config built and pretrained, with its overrides (a ModelChoice)",
        "RunConfig": "the registered model a run file builds, with its overrides (a ModelChoice)",
        "GPTRecipe": "the registered GPT the recipe builds, with its overrides (a ModelChoice)",
        "OcrRecRecipe": "RecognizerConfig fields the recipe changes from their defaults (a mapping)",
    },
    "data": {
        "PretrainConfig": "a data build's directory",
        "FinetuneConfig": "'builtin' or a JSONL path of task examples",
        "RunConfig": "the [data] table: a corpus or a token file (a DataConfig)",
        "ErnieStageConfig": "the data build the stage makes (a DataBuildConfig)",
        "ErnieRecipe": "the shared data build the recipe makes (a DataBuildConfig)",
        "ErnieMiniRecipe": "ernie-mini-zh's data build, ErnieRecipe's corpora plus debian-zh (a DataBuildConfig)",
        "GPTRecipe": "the shared data build the recipe makes (a DataBuildConfig)",
        "OcrDetRecipe": "the page pool ocr-det-zh renders once and reuses (an OcrDataConfig)",
        "OcrRecRecipe": "the line pool ocr-rec-zh renders once and reuses (an OcrDataConfig)",
        "LayoutDetRecipe": "the document pages layout-det-zh renders once and reuses (a LayoutDataConfig)",
    },
    "seq_len": {
        "DataBuildConfig": "tokens per row of a data build ([CLS] and [SEP] included)",
        "DataConfig": "tokens per training window cut from a corpus or token file",
        "Job": "tokens per sequence of a planned workload (nothing is built)",
    },
    "vocab_size": {
        "DataBuildConfig": "the WordPiece vocabulary to train",
        "DataConfig": "the vocabulary a given token file's ids come from",
    },
    "out": {
        "DataBuildConfig": "the data build's directory",
        "ExportOptions": "the inference directory written",
        "ReportOptions": "the report's PNG file",
        "BuildOptions": "the model store a recipe writes into",
        "OcrDataConfig": "the OCR data set's directory (images, labels, manifest)",
        "LayoutDataConfig": "the layout data set's directory (pages, COCO files, pages.jsonl, manifest)",
    },
    "overwrite": {
        "DataBuildConfig": "replace an existing data build",
        "ExportOptions": "replace an existing inference directory",
    },
    "max_length": {
        "FinetuneConfig": "the longest training input, in tokens",
        "TaskOptions": "the longest input a task's predictor sees, in tokens",
    },
    "task": {
        "FinetuneConfig": "the task a model is fine-tuned for (sentiment_analysis, ner)",
        "TaskOptions": "the Taskflow task run (any of `sampan task --list`)",
    },
    "workers": {
        "DataBuildConfig": "processes that segment, tag and tokenize a build",
        "ServeSpec": "uvicorn worker processes, each with its own copy of the models",
        "OcrDataConfig": "processes that render OCR images (the bytes do not depend on it)",
        "LayoutDataConfig": "browser processes that lay out pages (the pages do not depend on it)",
    },
    "corpora": {
        "DataBuildConfig": "the corpora tokenized into shards",
        "OcrDataConfig": "the corpora OCR lines and pages are cut from",
        "LayoutDataConfig": "the corpora the pages' text is cut from",
    },
    "seed": {
        "TrainingArguments": "the run's seed (initialisation, data order, dropout)",
        "OcrDataConfig": "the seed every rendered OCR image's generator derives from",
        "LayoutDataConfig": "the seed every page's content, template and scan derive from",
    },
    "beta": {
        "DBLossConfig": "the weight of the DB threshold map's L1 loss",
        "DPOConfig": "DPO's temperature on the policy / reference log-ratio",
    },
    "shrink_ratio": {
        "DBTargetConfig": "the Vatti ratio DB's probability targets are shrunk by",
        "DBPostProcessConfig": "the ratio the inverse unclip undoes (the detector's config checks it equals the targets')",
    },
    # Each detector recipe shapes its own network's LCNet backbone: the DB text detector's (ocr-det-zh)
    # and the layout detector's (layout-det-zh) are set per recipe, and neither build reads the other's.
    "stem_channels": {
        "OcrDetRecipe": "channels of the DB text detector's backbone stem",
        "LayoutDetRecipe": "channels of the layout detector's backbone stem",
    },
    "stage_channels": {
        "OcrDetRecipe": "output channels of the DB text detector's four backbone stages",
        "LayoutDetRecipe": "output channels of the layout detector's four backbone stages",
    },
    "stage_blocks": {
        "OcrDetRecipe": "blocks in each of the DB text detector's backbone stages",
        "LayoutDetRecipe": "blocks in each of the layout detector's backbone stages",
    },
    "export_only": {
        "OcrDetRecipe": "score and store the detector run's best model so far, training nothing",
        "OcrRecRecipe": "score and store the recogniser run's best model so far, training nothing",
    },
    "strategy": {
        "TrainingArguments": "the run's hybrid-parallel layout, validated into DistributedStrategy's dict",
        "SimulateOptions": "a layout to simulate, as the JSON text or the file (a run file's [strategy]) it is in",
    },
    # The two rendered data sets share these words, each for its own images: an OCR build's pages
    # are Pillow-drawn blocks for the DB detector, a layout build's are Chromium-laid documents; a
    # user sets them per build, and neither build reads the other's.
    "train_pages": {
        "OcrDataConfig": "text-detection page images in an OCR build's train split",
        "LayoutDataConfig": "Chromium-laid document pages in a layout build's train split",
    },
    "test_pages": {
        "OcrDataConfig": "text-detection page images in an OCR build's test split",
        "LayoutDataConfig": "Chromium-laid document pages in a layout build's test split",
    },
    "fonts": {
        "OcrDataConfig": "catalogue fonts Pillow draws an OCR build's lines and pages in",
        "LayoutDataConfig": "catalogue fonts a layout build's pages are set in (as CSS @font-face)",
    },
    "held_out_fonts": {
        "OcrDataConfig": "fonts drawn only into an OCR build's test split",
        "LayoutDataConfig": "fonts set only into a layout build's test pages",
    },
    "page_size": {
        "OcrDataConfig": "an OCR page image's size before augmentation",
        "LayoutDataConfig": "the browser viewport a layout page is laid out in",
    },
    "file_quality": {
        "OcrDataConfig": "the JPEG quality an OCR build's images are saved at",
        "LayoutDataConfig": "the JPEG quality a layout build's scanned pages are saved at",
    },
}


def _parsers(parser: argparse.ArgumentParser):
    """``parser`` and every sub-parser under it, each with its deferred flags added."""
    if isinstance(parser, Parser):
        parser.populate()
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield from _parsers(sub)


@pytest.fixture(scope="module")
def verbs() -> list[argparse.ArgumentParser]:
    return list(_parsers(cli.build_parser()))


def verb_configs(verbs) -> list[type]:
    """The configs the verbs' flags come from, and every config they nest."""
    roots = [cls for parser in verbs for cls in getattr(parser, "sampan_configs", [])]
    return list(dict.fromkeys(c for root in roots for c in config_classes(root)))


def declared_twice(classes: list[type]) -> dict[str, list[str]]:
    """Field names declared by more than one class, as ``{name: [class names]}``. Nesting is not
    declaring: fields that nest the same config (``training: TrainingArguments`` in four classes)
    are one declaration, the nested class's."""
    from sampan.utils.config import nesting

    owners: dict[str, dict[str, str]] = defaultdict(dict)  # name -> {declaration: class}
    for cls in classes:
        for field in dataclasses.fields(cls):
            nest = nesting(field)
            key = f"nests {nest.cls.__name__}" if nest is not None else f"declared in {cls.__name__}"
            owners[field.name].setdefault(key, cls.__name__)
            if nest is not None:
                owners[field.name][f"{key} by {cls.__name__}"] = cls.__name__
    out = {}
    for name, found in owners.items():
        kinds = {k for k in found if " by " not in k}
        if len(kinds) > 1:
            out[name] = sorted(set(found.values()))
    return out


def test_every_flag_of_every_verb_comes_from_its_config(verbs):
    handwritten = []
    for parser in verbs:
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            if getattr(action, "sampan_path", None) is None:
                handwritten.append(f"{parser.prog}: {'/'.join(action.option_strings) or action.dest}")
    assert handwritten == []
    from sampan.commands import COMMANDS
    from sampan.store.models import RECIPE_NAMES

    handlers = {p.prog.removeprefix("sampan ") for p in verbs if p.get_default("func") is not None}
    actions = {"data": ["build", "build-chat", "build-layout", "build-ocr", "fetch"], "hub": ["list", "evaluate", *(f"build {r}" for r in RECIPE_NAMES)],
               "bench": ["comm"]}
    assert handlers == {f"{verb} {action}" if verb in actions else verb for verb in COMMANDS
                        for action in actions.get(verb, [""])} | {f"{v} {a}" for v in actions for a in actions[v]}
    assert all(getattr(p, "sampan_configs", None) for p in verbs if p.get_default("func") is not None)


def test_each_setting_is_declared_once(verbs):
    classes = verb_configs(verbs)
    names = {cls.__name__ for cls in classes}
    assert {"TrainingArguments", "PretrainConfig", "FinetuneConfig", "DemoConfig", "RunConfig", "Job",
            "GpuChoice", "ServeSpec", "GPTRecipe", "NERRecipe"} <= names
    assert len(names) == len(classes), "two config classes share a name"
    found = declared_twice(classes)
    assert found == {name: sorted(owners) for name, owners in HOMONYMS.items()}


def test_a_setting_declared_twice_is_caught():
    """The check itself: a config that restates TrainingArguments' learning rate beside nesting it."""
    from sampan.trainer.arguments import TrainingArguments

    @dataclasses.dataclass
    class Restating:
        learning_rate: float = 1e-3
        training: TrainingArguments = nested(TrainingArguments)

    @dataclasses.dataclass
    class Nesting:
        training: TrainingArguments = nested(TrainingArguments, learning_rate=1e-3)

    assert declared_twice(config_classes(Restating)) == {"learning_rate": ["Restating", "TrainingArguments"]}
    assert declared_twice(config_classes(Nesting)) == {}


def test_nested_defaults_merge_and_old_keys_name_their_new_place():
    from sampan.finetune.config import FinetuneConfig
    from sampan.pretraining.config import PretrainConfig

    config = PretrainConfig(training={"max_steps": 12})
    assert (config.training.max_steps, config.training.learning_rate) == (12, 5e-4)  # pretraining's default kept
    with pytest.raises(ValueError, match="key max_steps is now training.max_steps"):
        build(PretrainConfig, {"max_steps": 12})
    with pytest.raises(ValueError, match="key epochs is now training.num_train_epochs"):
        build(FinetuneConfig, {"epochs": 2})
    with pytest.raises(ValueError, match=r"unknown key 'learning_rat' in training \(TrainingArguments\); "
                                         "did you mean 'learning_rate'"):
        build(PretrainConfig, {"training": {"learning_rat": 1.0}})


def test_a_parent_refuses_the_fields_it_sets_itself():
    from sampan.demo.ernie_stage import ErnieStageConfig

    with pytest.raises(ValueError, match="ErnieStageConfig.pretrain.data is set by the demo"):
        ErnieStageConfig(pretrain={"data": "elsewhere"})


def test_every_config_round_trips_through_a_mapping(verbs):
    """What a run file or a model card stores of a config builds the same config back."""
    from sampan.utils.config import to_dict

    tried = 0
    for cls in verb_configs(verbs):
        if any(leaf.default is dataclasses.MISSING for leaf in leaves(cls)):
            continue
        config = cls()
        assert build(cls, to_dict(config)) == config, cls.__name__
        tried += 1
    assert tried >= 20


def test_resolve_nested_refuses_a_wrong_type():
    from sampan.trainer.arguments import TrainingArguments

    @dataclasses.dataclass
    class Holder:
        training: TrainingArguments = nested(TrainingArguments)

        def __post_init__(self):
            resolve_nested(self)

    with pytest.raises(ValueError, match="training must be a TrainingArguments or a mapping of its fields"):
        Holder(training=3)


def test_run_files_written_before_the_tree_still_load():
    """The run files in examples/ (and the ones `sampan plan --write-strategy` writes: test_planner.py)
    keep their [model] [data] [training] [strategy] tables."""
    from pathlib import Path

    from sampan.runfile import RunConfig

    files = sorted((Path(__file__).resolve().parents[1] / "examples" / "configs").glob("*.toml"))
    assert files
    for path in files:
        config = RunConfig.from_file(path)
        assert config.model.name and config.training.max_steps != 0, path


def test_every_setting_is_documented(verbs):
    """``--help`` explains every flag: each field of each config has its documentation."""
    from sampan.utils.flags import field_docs

    missing = [f"{cls.__name__}.{f.name}" for cls in verb_configs(verbs) for f in dataclasses.fields(cls)
               if f.init and not field_docs(cls).get(f.name)]
    assert missing == []


def test_the_verbs_use_only_public_names():
    """``sampan/commands/`` holds the verbs and calls the packages below through their public API:
    no imported module path or name starts with a single underscore."""
    import ast
    from pathlib import Path

    def private(name: str) -> bool:
        return any(part.startswith("_") and not part.startswith("__") for part in name.split("."))

    found = []
    for path in sorted((Path(cli.__file__).parent / "commands").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if private(n)]
    assert found == []


def test_the_flag_forms_docs_configuration_md_promises(tmp_path):
    """Dashed nested flags, a run file's fields as flags of `sampan train`, and the demo's --device
    that sets every stage's."""
    from sampan.demo import DemoConfig
    from sampan.pretraining.config import PretrainConfig
    from sampan.runfile import RunConfig
    from sampan.utils.flags import dataclass_from_args, overrides_from_args

    parser = cli.build_parser()
    config = dataclass_from_args(PretrainConfig, parser.parse_args(["pretrain", "--data", "d",
                                                                    "--training.max-steps", "7"]))
    assert config.training.max_steps == 7
    run = tmp_path / "run.toml"
    run.write_text('[model]\nname = "gpt-tiny"\nnum_layers = 2\n[training]\nmax_steps = 300\n')
    args = parser.parse_args(["train", "--config", str(run), "--training.max_steps", "5", "--model.overrides",
                              "hidden_size=64", "--data.seq_len", "32"])
    assert overrides_from_args(RunConfig, args) == {"training.max_steps": 5, "model.overrides": {"hidden_size": 64},
                                                    "data.seq_len": 32}  # only what was given
    loaded = RunConfig.from_file(run, overrides_from_args(RunConfig, args))
    assert (loaded.training.max_steps, loaded.data.seq_len) == (5, 32)
    assert loaded.model.overrides == {"num_layers": 2, "hidden_size": 64}  # the file's kept beside the flag's
    demo = dataclass_from_args(DemoConfig, parser.parse_args(["demo", "--device", "cpu"]))
    assert {demo.gpt.training.device, demo.ernie.pretrain.training.device,
            demo.sentiment.finetune.training.device} == {"cpu"}

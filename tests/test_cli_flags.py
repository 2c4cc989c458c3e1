"""Flags generated from config dataclasses (``sampan.utils.flags``), the verbs that use them, and
how ``sampan`` reports a user error (one line, status 2; ``SAMPAN_DEBUG=1`` for the traceback)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest

from sampan import cli
from sampan.commands import COMMANDS, Parser
from sampan.utils.config import nested, resolve_nested
from sampan.utils.flags import add_dataclass_args, dataclass_from_args, field_docs, parse_bool


@dataclasses.dataclass
class Knobs:
    """A config of every kind the helper reads.

    Fields:
        overwrite: replace what is there.
        pack: join short rows; about 50% less padding.
        limit: at most this many, None = all.
        name: a name, or None.
        scale: a factor, or None.
        names: comma-separated names.
        sizes: comma-separated sizes.
    """

    overwrite: bool = False
    pack: bool = True
    limit: int | None = None
    name: str | None = "x"
    scale: float | None = 0.5
    names: tuple[str, ...] = ("a", "b")
    sizes: tuple[int, ...] = ()
    pair: tuple[int, int] = (1, 2)
    """Exactly two integers (an attribute docstring)."""
    items: list[str] = dataclasses.field(default_factory=list)
    mode: Literal["fast", "slow"] = "fast"
    steps: int = 3
    rate: float = 1e-3


def _parser(cls=Knobs, **kwargs) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t", exit_on_error=False)
    add_dataclass_args(parser, cls, **kwargs)
    return parser


def _parse(*argv: str, cls=Knobs, **kwargs):
    return dataclass_from_args(cls, _parser(cls, **kwargs).parse_args(list(argv)))


def test_no_flags_give_the_dataclass_defaults():
    assert _parse() == Knobs()


@pytest.mark.parametrize("argv, expected", [
    (["--overwrite"], True), (["--no-overwrite"], False),
    # the old helper's bug: type=bool, and bool("False") is True
    (["--overwrite", "False"], False), (["--overwrite", "false"], False), (["--overwrite=0"], False),
    (["--overwrite", "true"], True), (["--overwrite", "yes"], True), (["--overwrite", "ON"], True),
])
def test_bool_flags(argv, expected):
    assert _parse(*argv).overwrite is expected


def test_a_true_default_turns_off_with_no_flag_or_a_false_value():
    assert _parse().pack is True
    assert _parse("--no-pack").pack is False and _parse("--pack", "false").pack is False
    assert _parse("--no-pack", "--pack").pack is True  # the last one given wins


def test_a_bad_bool_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as err:
        _exiting_parser().parse_args(["--overwrite", "maybe"])
    assert err.value.code == 2
    assert "argument --overwrite: expected true or false, got 'maybe'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _exiting_parser().parse_args(["--no-overwrite", "false"])  # --no-x takes no value


def _exiting_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t")
    add_dataclass_args(parser, Knobs)
    return parser


def test_optional_fields_parse_their_inner_type_or_none():
    # the old helper's bug: type=type(None) cannot parse anything
    assert _parse("--limit", "7").limit == 7 and _parse("--limit", "none").limit is None
    assert _parse().limit is None and _parse().name == "x"
    assert _parse("--name", "None").name is None and _parse("--name", "y").name == "y"
    assert _parse("--scale", "2e-3").scale == pytest.approx(2e-3) and _parse("--scale", "NONE").scale is None
    with pytest.raises(argparse.ArgumentError, match="invalid int value: 'seven'"):
        _parse("--limit", "seven")


def test_sequences_are_comma_lists():
    # the old helper's bug: type=tuple made ("x", ",", "y") of "x,y"
    assert _parse("--names", "x, y,z").names == ("x", "y", "z")
    assert _parse("--names", "").names == () and _parse().names == ("a", "b")
    assert _parse("--sizes", "1,2,3").sizes == (1, 2, 3)
    assert _parse("--items", "p,q").items == ["p", "q"] and _parse().items == []
    assert _parse("--pair", "3,4").pair == (3, 4)
    with pytest.raises(argparse.ArgumentError, match="expected 2 comma-separated values"):
        _parse("--pair", "3,4,5")
    with pytest.raises(argparse.ArgumentError, match="invalid list value"):
        _parse("--sizes", "1,x")


def test_literals_are_choices_and_scalars_keep_their_type():
    assert _parse("--mode", "slow").mode == "slow"
    with pytest.raises(argparse.ArgumentError, match="invalid choice"):
        _parse("--mode", "medium")
    knobs = _parse("--steps", "5", "--rate", "0.1")
    assert knobs.steps == 5 and knobs.rate == 0.1 and isinstance(knobs.rate, float)
    assert _parse("--steps", "1e3").steps == 1000  # as --set reads it; a fraction is refused, not cut
    with pytest.raises(argparse.ArgumentError, match="invalid int value: '2.5'"):
        _parse("--steps", "2.5")


def test_help_comes_from_the_docstring_with_the_default():
    parser = argparse.ArgumentParser(prog="t", formatter_class=lambda prog: argparse.HelpFormatter(prog, width=400))
    add_dataclass_args(parser, Knobs)
    text = parser.format_help()
    assert "--overwrite [BOOL]  replace what is there. (default: false)" in text
    assert "--no-pack" in text and "about 50% less padding. (default: true)" in text  # % survives argparse
    assert "at most this many, None = all. (default: none)" in text
    assert "comma-separated names. (default: a,b)" in text and "comma-separated sizes. (default: '')" in text
    assert "Exactly two integers (an attribute docstring). (default: 1,2)" in text
    assert "--mode {fast,slow}" in text
    docs = field_docs(Knobs)
    assert docs["pair"] == "Exactly two integers (an attribute docstring)." and "mode" not in docs


def test_renames_required_choices_and_exclusions(capsys):
    parser = _parser(flags={"steps": ("--max-steps", "--steps")}, required=("name",), exclude=("items",),
                     choices={"steps": (3, 5)})
    args = parser.parse_args(["--steps", "5", "--name", "n"])
    assert args.steps == 5 and not hasattr(args, "items")
    assert dataclass_from_args(Knobs, args, items=["z"]) == Knobs(steps=5, name="n", items=["z"])
    with pytest.raises(argparse.ArgumentError, match="invalid choice"):
        parser.parse_args(["--steps", "4", "--name", "n"])
    with pytest.raises(SystemExit):
        parser.parse_args([])
    assert "the following arguments are required: --name" in capsys.readouterr().err
    with pytest.raises(TypeError, match="no fields"):
        _parser(exclude=("no_such_field",))


def test_a_field_without_a_command_line_form_must_be_excluded():
    @dataclasses.dataclass
    class WithSet:
        table: set[int] = dataclasses.field(default_factory=set)
        n: int = 1

    with pytest.raises(TypeError, match=r"WithSet.table: no command-line form"):
        _parser(WithSet)
    assert _parse("--n", "2", cls=WithSet, exclude=("table",)) == WithSet(n=2)


@dataclasses.dataclass
class Table:
    """Fields:
        table: a mapping.
    """

    table: dict = dataclasses.field(default_factory=lambda: {"keep": 1})


def test_a_dict_flag_merges_key_value_pairs_or_takes_a_json_object():
    assert _parse(cls=Table).table == {"keep": 1}
    assert _parse("--table", "a.b=2", "--table", "c=x", cls=Table).table == {"keep": 1, "a": {"b": 2}, "c": "x"}
    assert _parse("--table", '{"only": [1, 2]}', cls=Table).table == {"only": [1, 2]}
    with pytest.raises(argparse.ArgumentError, match="expected KEY=VALUE or a JSON object"):
        _parse("--table", "nokey", cls=Table)
    with pytest.raises(argparse.ArgumentError, match="not a JSON object"):
        _parse("--table", "{broken", cls=Table)


def test_a_repeated_list_flag_adds_to_it_after_replacing_the_default():
    assert _parse("--names", "x", "--names", "y,z").names == ("x", "y", "z")


@dataclasses.dataclass
class Inner:
    """The nested part.

    Fields:
        steps: how many.
        fast: go fast.
    """

    steps: int = 5
    fast: bool = False


@dataclasses.dataclass
class Outer:
    """Fields:
        inner: a nested config.
        flat: a flattened one.
        name: a name.
    """

    inner: Inner = nested(Inner, steps=7)
    flat: Inner = nested(Inner, flatten=True, fast=True)
    name: str = "o"

    def __post_init__(self):
        resolve_nested(self)


def test_nested_configs_get_dotted_flags_and_flattened_ones_plain_flags():
    assert _parse(cls=Outer) == Outer()
    assert Outer().inner.steps == 7 and Outer().flat.fast is True  # the parent's defaults
    got = _parse("--inner.steps", "9", "--inner.fast", "--steps", "3", "--no-fast", cls=Outer)
    assert got == Outer(inner=Inner(steps=9, fast=True), flat=Inner(steps=3, fast=False))
    assert _parse("--inner.steps", "4", cls=Outer).inner.steps == 4
    assert _parse("--in", "4", cls=Outer, aliases={"inner.steps": ("--in",)}).inner.steps == 4
    help_text = _parser(Outer).format_help()
    assert "--inner.steps STEPS" in help_text and "how many. (default: 7)" in help_text
    assert "--inner.*: Inner" in help_text and "--fast [BOOL]" in help_text


def test_parse_bool_words():
    assert [parse_bool(w) for w in ("1", "True", "yes", "on", "0", "FALSE", "no", "off")] == [True] * 4 + [False] * 4
    with pytest.raises(argparse.ArgumentTypeError):
        parse_bool("2")


# The verbs whose flags are generated: each field once, defaults from the config, old flags kept.

def _verb(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def test_finetune_flags_are_the_configs():
    from sampan.finetune.config import FinetuneConfig

    args = _verb("finetune", "--task", "ner", "--model", "m", "--output-dir", "o")
    assert dataclass_from_args(FinetuneConfig, args) == FinetuneConfig(task="ner", model="m",
                                                                       training={"output_dir": "o"})
    # the flags the tests, docs and recipes have always used
    args = _verb("finetune", "--task", "ner", "--model", "m", "--output-dir", "o", "--steps", "6",
                 "--no-tag-transitions", "--no-group-by-length", "--overwrite", "--freeze", "a.b,c",
                 "--augment-types", "PER", "--max-train-examples", "200", "--dropout", "0.1", "--json")
    config = dataclass_from_args(FinetuneConfig, args)
    training = config.training
    assert (training.max_steps, config.tag_transitions, training.group_by_length,
            training.overwrite_output_dir) == (6, False, False, True)
    assert config.freeze == ("a.b", "c") and config.augment_types == ("PER",) and config.max_train_examples == 200
    assert config.dropout == 0.1 and args.json
    # fields that had no flag before have one now
    config = dataclass_from_args(FinetuneConfig, _verb("finetune", "--task", "ner", "--model", "m", "--output-dir",
                                                        "o", "--lora-targets", "q_proj", "--warmup", "0.2",
                                                        "--training.lr_scheduler", "cosine"))
    assert config.lora_targets == ("q_proj",) and config.training.warmup_ratio == 0.2
    assert config.training.lr_scheduler == "cosine"  # every TrainingArguments field is a flag


def test_pretrain_and_data_build_flags_are_the_configs():
    from sampan.pretraining.config import PretrainConfig
    from sampan.text.build import DataBuildConfig

    args = _verb("pretrain", "--data", "d")
    assert dataclass_from_args(PretrainConfig, args) == PretrainConfig(data="d")
    args = _verb("pretrain", "--data", "d", "--steps", "4", "--no-pack", "--features", "pinyin,stroke", "--resume",
                 "--override", "num_layers=2", "--override", "dropout=0.0", "--model", "ernie-base")
    config = dataclass_from_args(PretrainConfig, args)
    assert (config.training.max_steps, config.pack, config.features) == (4, False, ("pinyin", "stroke"))
    assert config.training.resume_from_checkpoint == "auto"
    assert (config.model.name, config.model.overrides) == ("ernie-base", {"num_layers": 2, "dropout": 0.0})
    assert dataclass_from_args(DataBuildConfig, _verb("data", "build", "--out", "x")) == DataBuildConfig(out="x")
    args = _verb("data", "build", "--out", "x", "--corpus", "news", "--tokenizer", "t.json", "--overwrite",
                 "--max-docs", "5", "--workers", "2")
    assert dataclass_from_args(DataBuildConfig, args) == DataBuildConfig(
        corpora=("news",), out="x", tokenizer="t.json", overwrite=True, max_docs=5, workers=2)


def test_demo_flags_are_the_configs():
    from sampan.demo import DemoConfig

    assert dataclass_from_args(DemoConfig, _verb("demo")) == DemoConfig()
    got = dataclass_from_args(DemoConfig, _verb("demo", "--gpt.training.max_steps", "7", "--gpt.training.amp", "bf16",
                                                 "--ernie.pretrain.training.max_steps", "5", "--stages", "ernie,gpt"))
    assert got == DemoConfig(gpt={"training": {"max_steps": 7, "amp": "bf16"}},
                             ernie={"pretrain": {"training": {"max_steps": 5}}}, stages=("ernie", "gpt"))
    assert got.gpt.training.learning_rate == 3e-3 and got.ernie.pretrain.training.learning_rate == 1e-3


def test_every_command_module_is_registered():
    modules = {p.stem for p in (Path(cli.__file__).parent / "commands").glob("*.py") if p.stem != "__init__"}
    assert modules == set(COMMANDS)
    parser = cli.build_parser()
    assert isinstance(parser, Parser)
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(verbs.choices) == list(COMMANDS)


# User errors: one line on stderr, status 2, the verb named; SAMPAN_DEBUG=1 raises instead.

def test_a_user_error_is_one_line_with_status_2(capsys):
    assert cli.main(["plan", "--model", "gpt-175b", "--gpus", "1024", "--top", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "sampan plan: error: --top must be >= 1, got 0\n"
    assert cli.main(["hub", "evaluate", "x", "--write", "--max-examples", "5"]) == 2
    assert capsys.readouterr().err.startswith("sampan hub evaluate: error: --write records whole-split figures")
    assert cli.main(["task"]) == 2
    assert capsys.readouterr().err == "sampan task: error: name a task (sampan task --list shows them)\n"


@pytest.mark.parametrize("error, status", [(FileNotFoundError("no such file: x"), 2),
                                           (FileExistsError("x exists: pass --overwrite"), 2),
                                           (NotADirectoryError("x is a file"), 2),
                                           (ConnectionError("the registry did not answer"), 1)])
def test_each_kind_of_user_error(monkeypatch, capsys, error, status):
    def fail(args):
        raise error

    monkeypatch.setattr("sampan.commands.models.run", fail)
    assert cli.main(["models"]) == status
    assert capsys.readouterr().err == f"sampan models: error: {error}\n"


def test_a_bug_is_not_a_user_error(monkeypatch):
    def fail(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr("sampan.commands.models.run", fail)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["models"])


def test_sampan_debug_shows_the_traceback(monkeypatch):
    monkeypatch.setenv("SAMPAN_DEBUG", "1")
    with pytest.raises(ValueError, match="--top must be >= 1"):
        cli.main(["plan", "--model", "gpt-175b", "--gpus", "1024", "--top", "0"])


def test_the_console_command_prints_no_traceback():
    argv = [sys.executable, "-m", "sampan.cli", "plan", "--model", "no-such-model", "--gpus", "8"]
    env = {k: v for k, v in os.environ.items() if k != "SAMPAN_DEBUG"}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.startswith("sampan plan: error: ") and len(run.stderr.strip().splitlines()) == 1
    debug = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env | {"SAMPAN_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr

"""One reader for every verb's KEY=VALUE flags (sampan.utils.settings)."""

from __future__ import annotations

import pytest

from sampan.utils.settings import coerce, load_yaml, parse_assignments, parse_bool, split_assignment


def test_values_read_as_yaml_with_yaml_12_floats():
    got = parse_assignments(["lr=3e-4", "steps=100", "name=gpt", "flag=true", "none=null", "ids=[1, 2]"],
                            "--set", "lr=1e-3")
    assert got == {"lr": 3e-4, "steps": 100, "name": "gpt", "flag": True, "none": None, "ids": [1, 2]}
    assert isinstance(load_yaml("3e-4"), float) and load_yaml("1_000") == 1000


@pytest.mark.parametrize("word,value", [("true", True), ("Yes", True), ("ON", True), ("1", True),
                                        ("false", False), ("no", False), ("Off", False), ("0", False)])
def test_one_set_of_boolean_words(word, value):
    assert parse_bool(word, "x") is value
    assert coerce(word, False, "x") is value


def test_malformed_pairs_name_the_flag_and_show_the_form():
    with pytest.raises(ValueError, match=r"--option 'seed' must look like KEY=VALUE \(e.g. seed=3\)"):
        split_assignment("seed", "--option", "seed=3")
    with pytest.raises(ValueError, match="must look like table.key=value"):
        parse_assignments(["=3"], "--set", "training.max_steps=1", form="table.key=value")
    with pytest.raises(ValueError, match="x is true or false"):
        parse_bool("maybe", "x")


def test_coerce_types_by_the_default():
    assert coerce("1e3", 0, "steps") == 1000
    assert coerce("0.5", 1.0, "lr") == 0.5 and coerce("news", "", "corpora") == "news"
    with pytest.raises(ValueError, match="steps takes an integer, e.g. steps=10"):
        coerce("2.5", 0, "steps", "steps=10")  # refused, not cut to 2
    with pytest.raises(ValueError, match="lr takes a number, got 'fast'"):
        coerce("fast", 1.0, "lr")

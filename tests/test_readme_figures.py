"""The performance, tasks and serving tables of docs/benchmarks.md are their results files, figure for figure.

(They were the README's tables once, hence this file's name.) ``benchmarks/results_tables.py`` renders
each table from a template in ``benchmarks/tables/`` whose figures are fields of
``benchmarks/results/*.json``; these tests hold docs/benchmarks.md to that rendering, hold every
results file to a machine record, and hold ``make bench`` to every benchmark the tables read.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import results_tables  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"


def test_benchmark_tables_are_the_results_files():
    page = PAGE.read_text(encoding="utf-8")
    rendered, tables = results_tables.rendered_page(page)
    assert set(tables) == {"performance", "serving", "tasks", "ocr", "layout"}
    assert rendered == page, "docs/benchmarks.md's tables differ from benchmarks/results: run python benchmarks/results_tables.py"


def test_every_results_file_records_its_machine():
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        machine = data.get("machine")
        assert isinstance(machine, dict), f"{path.name} records no machine"
        assert machine.get("cpu_capability") and machine.get("cpu_count"), f"{path.name}: {machine}"
        assert data.get("benchmark") and data.get("timestamp"), f"{path.name} does not say what made it and when"


def _bench_recipe() -> str:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(r"^bench:.*\n((?:\t.*\n)+)", text, re.M)
    assert match, "Makefile has no bench target"
    return match.group(1)


def test_make_bench_runs_every_benchmark_the_tables_read():
    recipe = _bench_recipe()
    _, tables = results_tables.rendered_page(PAGE.read_text(encoding="utf-8"))
    stems = set().union(*(t.files for t in tables.values()))
    assert {"model_step", "tasks", "serving", "knowledge_masking"} <= stems
    for stem in sorted(stems):
        script = json.loads((RESULTS / f"{stem}.json").read_text(encoding="utf-8"))["benchmark"]
        assert f"benchmarks/{script}.py" in recipe, f"make bench does not run benchmarks/{script}.py ({stem}.json)"
        if stem != script:
            assert f"--out benchmarks/results/{stem}.json" in recipe, f"make bench does not write {stem}.json"
    assert "benchmarks/results_tables.py" in recipe, "make bench must re-render docs/benchmarks.md's tables"


def test_the_readme_chat_figures_are_the_card_and_the_results_files():
    """The README's chat figures and ratios, hand-written, are what chat-zh-tiny's card and the
    chat_sft / decode / chat_serving results hold (rounded as shown)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    card = json.loads((ROOT / "sampan" / "hub" / "models" / "chat-zh-tiny" / "card.json").read_text(encoding="utf-8"))
    m = card["metrics"]
    shown = (f"sentiment accuracy {m['base_sentiment_accuracy']:.1%} → {m['sentiment_accuracy']:.1%}; "
             f"entity F1 (exact match) {m['base_entity_f1']:.3f} → {m['entity_f1']:.3f}; "
             f"poems in the asked form {m['base_poem_form_share']:.1%} → {m['poem_form_share']:.1%}")
    assert shown in " ".join(readme.split()), f"README's chat figures are not the card's: {shown}"
    result = {stem: json.loads((RESULTS / f"{stem}.json").read_text(encoding="utf-8"))
              for stem in ("chat_sft", "decode", "chat_serving")}
    assert f"**{result['chat_sft']['packed_vs_hf']['speedup']:.2f}×**" in readme
    assert f"**{result['decode']['lengths']['256']['cached_ort_over']['full_window_ort']:.1f}×**" in readme
    assert f"**{result['chat_serving']['ratios']['32']['rps_vs_one_at_a_time']:.2f}×**" in readme



def test_the_readme_moe_figure_is_the_results_file():
    """The README's MoE block range is the slowest and fastest shape of moe_block.json, as shown."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shapes = json.loads((RESULTS / "moe_block.json").read_text(encoding="utf-8"))["shapes"].values()
    ratios = [shape["sampan_over"]["transformers_eager"] for shape in shapes]
    experts = [shape["experts"] for shape in shapes]
    assert f"**{min(ratios):.1f}–{max(ratios):.1f}×**" in readme
    assert f"({min(experts)}–{max(experts)} experts" in readme


# The renderer's own rules, on templates and results made here.

def _setup(tmp_path: Path, template: str, results: dict[str, dict]) -> tuple[Path, results_tables.Results]:
    templates = tmp_path / "templates"
    templates.mkdir(parents=True)
    (templates / "t.md").write_text(template, encoding="utf-8")
    folder = tmp_path / "results"
    folder.mkdir()
    for stem, data in results.items():
        (folder / f"{stem}.json").write_text(json.dumps(data), encoding="utf-8")
    return templates, results_tables.Results(folder)


AVX2 = {"cpu_capability": "AVX2", "cpu_count": 2}
AVX512 = {"cpu_capability": "AVX512", "cpu_count": 2}


def test_renders_fields_formats_and_verdicts(tmp_path):
    template = ("<!-- figures: result -->\n| what | result | goal |\n|---|---|---|\n"
                '| `a` | **{{ a.ratio | .2f }}×**, {{ a.share | .1% }}, {{ pick(a.rows, "name", "x").v }} '
                '| ≤ 1.05 {{ mark(a.ratio <= 1.05) }} |\n')
    templates, results = _setup(tmp_path, template, {
        "a": {"machine": AVX2, "ratio": 0.9761, "share": 0.5203, "rows": [{"name": "x", "v": 7}, {"name": "y", "v": 8}]}})
    out = results_tables.render("t", results, templates)
    assert "| `a` | **0.98×**, 52.0%, 7 | ≤ 1.05 ✅ |" in out.text
    assert out.files == {"a"}


def test_shown_and_interval_render_a_figure_or_the_status_of_what_was_not_measured(tmp_path):
    template = ("<!-- figures: x; y -->\n| what | x | y |\n|---|---|---|\n"
                '| a | {{ shown(a.s.x, "acc", ".3f") }} | {{ interval(a.d, "x.clean", "+.2f") }} |\n'
                '| b | {{ shown(a.s.y, "lines.acc", ".3f") }} | {{ interval(a.e, "x.clean", "+.2f") }} |\n')
    data = {"machine": AVX2, "s": {"x": {"status": "measured", "acc": 0.9876}, "y": {"status": "not trained yet"}},
            "d": {"status": "measured", "x": {"clean": {"difference": 0.1, "ci95": [0.05, 0.15]}}},
            "e": {"status": "not installed"}}
    templates, results = _setup(tmp_path, template, {"a": data})
    text = results_tables.render("t", results, templates).text
    assert "| a | 0.988 | +0.10 (+0.05 to +0.15) |" in text and "| b | not trained yet | not installed |" in text
    data["s"]["x"].pop("acc")  # a measured entry without the field is an error, not a status
    templates, results = _setup(tmp_path / "2", template, {"a": data})
    with pytest.raises(results_tables.TableError, match="no key 'acc'"):
        results_tables.render("t", results, templates)


def test_refuses_a_number_typed_into_a_figure_column(tmp_path):
    template = "<!-- figures: result -->\n| what | result |\n|---|---|\n| h=256 | {{ a.ratio | .2f }} and 1.09× |\n"
    templates, results = _setup(tmp_path, template, {"a": {"machine": AVX2, "ratio": 1.0}})
    with pytest.raises(results_tables.TableError, match="'result' has a number that is not a placeholder"):
        results_tables.render("t", results, templates)


def test_refuses_mixed_machines_without_a_cpu_column(tmp_path):
    rows = "| a | {{ a.x }} |\n| b | {{ b.x }} |\n"
    results = {"a": {"machine": AVX2, "x": 1}, "b": {"machine": AVX512, "x": 2}}
    templates, store = _setup(tmp_path, "<!-- figures: result -->\n| what | result |\n|---|---|\n" + rows, results)
    with pytest.raises(results_tables.TableError, match="more than one kind of machine"):
        results_tables.render("t", store, templates)
    (templates / "t.md").write_text("<!-- figures: result -->\n| what | result | CPU |\n|---|---|---|\n"
                                    "| a | {{ a.x }} | {{ cpu(a) }} |\n| b | {{ b.x }} | {{ cpu(b) }} |\n")
    assert "| b | 2 | AVX512 |" in results_tables.render("t", store, templates).text


def test_names_a_missing_field_and_a_missing_machine(tmp_path):
    templates, results = _setup(tmp_path, "<!-- figures: result -->\n| what | result |\n|---|---|\n"
                                          "| a | {{ a.runs.fast | .2f }} |\n",
                                {"a": {"machine": AVX2, "runs": {"slow": 1.0}}})
    with pytest.raises(results_tables.TableError, match=r"t.md:4: .*no key 'fast' \(there: slow\)"):
        results_tables.render("t", results, templates)
    templates2, results2 = _setup(tmp_path / "2", "<!-- figures: result -->\n| what | result |\n|---|---|\n| a | {{ a.x }} |\n",
                                  {"a": {"x": 1}})
    with pytest.raises(results_tables.TableError, match="records no machine"):
        results_tables.render("t", results2, templates2)


def test_placeholders_allow_no_python_beyond_the_expression_language(tmp_path):
    templates, results = _setup(tmp_path, "<!-- figures: result -->\n| what | result |\n|---|---|\n"
                                          "| a | {{ __import__('os').getcwd() }} |\n", {"a": {"machine": AVX2}})
    with pytest.raises(results_tables.TableError, match="not allowed"):
        results_tables.render("t", results, templates)


def test_check_mode_reports_a_stale_page(tmp_path, capsys):
    page = PAGE.read_text(encoding="utf-8")
    stale = tmp_path / "benchmarks.md"
    figure = re.search(r"time ratio \*\*(\d\.\d{3})\*\*", page)
    assert figure, "the performance table lost its model_step ratio"
    stale.write_text(page.replace(figure.group(0), "time ratio **0.500**", 1), encoding="utf-8")
    assert results_tables.main(["--check", "--page", str(stale)]) == 1
    assert "time ratio **0.500**" in capsys.readouterr().out
    assert results_tables.main(["--check", "--page", str(PAGE)]) == 0


def test_the_readme_chinese_figures_are_the_results_files():
    """The README's Chinese-text and Taskflow rows state what ernie_bases, masking_scale and the
    ernie-mini-sentiment run measured: the bases' Debian MLM losses, knowledge masking not ahead of
    character masking, and the shipped sentiment model's gain over TF-IDF, its interval above zero."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    bases = json.loads((RESULTS / "ernie_bases.json").read_text(encoding="utf-8"))["bases"]
    mini, tiny = (bases[n]["corpora"]["debian-zh"]["mlm_loss"] for n in ("ernie-mini-zh", "ernie-tiny-zh"))
    assert f"Debian MLM loss {mini:.2f} vs {tiny:.2f}" in readme
    masking = json.loads((RESULTS / "masking_scale.json").read_text(encoding="utf-8"))["summary"]
    assert masking["knowledge_minus_char"] and all(d["heldout_mlm_loss"] > 0 for d in masking["knowledge_minus_char"].values())
    assert "knowledge masking (not ahead of char masking)" in readme
    sentiment = json.loads((RESULTS / "tasks.json").read_text(encoding="utf-8"))["sentiment"]
    gap, (low, high) = sentiment["sampan_minus_baseline"], sentiment["sampan_minus_baseline"]["ci95"]
    assert sentiment["sampan_model"] == "ernie-mini-sentiment" and low > 0
    assert f"sentiment +{gap['difference'] * 100:.1f} points over TF-IDF (interval +{low * 100:.1f} to +{high * 100:.1f})" in readme

"""benchmarks/ocr.py: its scores on cases with a known answer, its quick run on a tiny held-out set with
tiny random sampan models, and the two peers' adapters (or, where a peer is not installed, the
recorded refusal with its install line).

Cost on this 2-core machine: the metric tests well under 1 s; the tiny set (4 line pairs, 1 page,
built once for the module) ~6 s; the quick run with sampan ~4 s; the peers' test (marked slow)
~12 s with both installed (PP-OCRv4 reads a page in ~4 s on one thread, Tesseract in ~2.5 s).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _ocr_metrics as M  # noqa: E402
import ocr  # noqa: E402
from _ocr_systems import PPOCRSystem, TesseractSystem, Unavailable  # noqa: E402

from sampan.vision import fonts as font_catalogue  # noqa: E402

needs_fonts = pytest.mark.skipif(not font_catalogue.select_fonts()["test"],
                                 reason="no held-out CJK font installed: make system-deps (fonts-wqy-zenhei)")


# -- scores with a known answer ------------------------------------------------------------------------
def test_line_scores_known_answers():
    refs = ["天下大势，分久必合", "Hello 世界", "二〇三五年"]
    perfect = M.line_scores(refs, refs)
    assert perfect["char_accuracy"] == 1.0 and perfect["exact_line_accuracy"] == 1.0
    empty = M.line_scores(refs, ["", "", ""])
    assert empty["char_accuracy"] == 0.0 and empty["exact_line_accuracy"] == 0.0
    # Tesseract's spaces between Chinese characters and a half-width comma are not errors after
    # normalisation, but are in the strict score.
    spaced = M.line_scores(["天下大势，分久必合"], ["天 下 大 势 , 分 久 必 合"])
    assert spaced["char_accuracy"] == 1.0 and spaced["exact_line_accuracy"] == 1.0
    assert spaced["char_accuracy_strict"] < 0.5
    # One substitution in 9 + 7 + 5 = 21 reference characters (the space of "Hello 世界" is dropped).
    one = M.line_scores(refs, ["天下大事，分久必合", "Hello 世界", "二〇三五年"])
    assert one["reference_characters"] == 21 and one["edits"] == 1
    assert one["char_accuracy"] == pytest.approx(1 - 1 / 21) and one["exact_line_accuracy"] == pytest.approx(2 / 3)


def test_paired_difference_perfect_minus_empty_is_one():
    lengths = [5, 3, 8, 2]
    d = M.paired_char_accuracy_difference([0, 0, 0, 0], lengths, lengths, resamples=200)
    assert d["difference"] == 1.0 and d["ci95"] == [1.0, 1.0]
    same = M.paired_char_accuracy_difference([1, 0, 2, 0], [1, 0, 2, 0], lengths, resamples=200)
    assert same["difference"] == 0.0 and same["ci95"] == [0.0, 0.0]


def _quad(x0, y0, x1, y1):
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=float)


def test_detection_and_end_to_end_known_answers():
    gold = [(_quad(10, 10, 200, 40), "天下大势"), (_quad(10, 60, 200, 90), "分久必合")]
    ious = M.iou_matrix([q for q, _ in gold], [q for q, _ in gold])
    assert len(M.match(ious)) == 2
    assert M.page_text_errors(gold, gold) == (0, 8)
    assert M.page_text_errors(gold, []) == (8, 8)  # nothing read: every character deleted
    # The first line read as two boxes (the left one last in the list): joined left to right, whole.
    parts = [(_quad(120, 10, 200, 40), "大势"), (_quad(10, 10, 120, 40), "天下"), gold[1]]
    assert M.page_text_errors(gold, parts) == (0, 8)
    # For detection the left part (IoU 110/190) matches the line, the right one (80/190) is a false box.
    counts = [(len(M.match(M.iou_matrix([q for q, _ in gold], [q for q, _ in parts]))), 2, 3)]
    assert M.detection_scores(counts) == {"precision": 2 / 3, "recall": 1.0, "f1": pytest.approx(0.8),
                                          "matched": 2, "gold_lines": 2, "detected_boxes": 3}
    # A box on no line: its text is inserted.
    stray = [*gold, (_quad(300, 300, 400, 330), "赘字")]
    assert M.page_text_errors(gold, stray) == (2, 8)


def test_docs_ocr_evaluation_table_is_the_results_file():
    import results_tables

    page = ROOT / "docs" / "ocr.md"
    text = page.read_text(encoding="utf-8")
    rendered, tables = results_tables.rendered_page(text, names=results_tables.TOPIC_PAGES[page], where=page)
    assert set(tables) == {"ocr"} and tables["ocr"].files == {"ocr"}
    assert rendered == text, "docs/ocr.md's table differs from benchmarks/results/ocr.json: run python benchmarks/results_tables.py"


# -- the pipeline on a tiny held-out set ----------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-ocr")
    # One corpus (三国演义) keeps the build to seconds; the benchmark's default is the engine's three.
    sets = ocr.build_sets(4, 1, 0, root, log=lambda m: None, corpora=("sanguo",))
    return root, sets, ocr.load_samples(sets)


class _Oracle:
    """Reads the truth (the labels of the set it was made from), or nothing at all."""

    reads_pages = True

    def __init__(self, data, empty: bool):
        self.name = "empty" if empty else "oracle"
        self.lines = {id(s): ("" if empty else t)
                      for c in ("clean", "degraded") for s, t in zip(data[c], data["texts"], strict=True)}
        self.pages = {id(s): ([] if empty else g) for s, g in zip(data["pages"], data["page_gold"], strict=True)}

    def read_line(self, sample):
        return self.lines[id(sample)]

    def read_page(self, sample):
        return self.pages[id(sample)]


@needs_fonts
def test_a_perfect_system_scores_one_and_an_empty_one_zero(tiny_set):
    _, sets, data = tiny_set
    assert sets["clean"]["lines"] == sets["degraded"]["lines"] == 4 and sets["clean"]["pages"] == 1
    assert all(v == 4 for k, v in sets["degraded"]["augmented_lines"].items() if k != "perspective")
    assert not any(sets["clean"]["augmented_lines"].values())
    for empty, expected in ((False, 1.0), (True, 0.0)):
        system = _Oracle(data, empty)
        lines, errors = ocr.evaluate_lines(system, data, log=lambda m: None)
        pages = ocr.evaluate_pages(system, data, log=lambda m: None)
        for condition in ("clean", "degraded"):
            assert lines[condition]["char_accuracy"] == expected
            assert lines[condition]["exact_line_accuracy"] == expected
        assert pages["detection"]["recall"] == expected and pages["detection"]["f1"] == expected
        assert pages["end_to_end"]["char_accuracy"] == expected
    # The paired interval of the perfect system over the empty one is [1, 1].
    errs = {n: ocr.evaluate_lines(_Oracle(data, n == "empty"), data, log=lambda m: None)[1]
            for n in ("sampan", "empty")}
    diffs = ocr.differences(errs, resamples=100)
    assert diffs["status"] == "measured"
    diff = diffs["empty"]["clean"]
    assert diff["char_accuracy"]["difference"] == 1.0 and diff["exact_line_accuracy"]["ci95"] == [1.0, 1.0]


def _tiny_sampan(directory: Path, charset_file: Path) -> tuple[Path, Path]:
    import torch

    from sampan.vision.charset import load_charset
    from sampan.vision.det_db import DBDetector, DBDetectorConfig
    from sampan.vision.rec_ctc import CTCRecognizer, RecognizerConfig

    torch.manual_seed(0)
    charset = load_charset(charset_file)
    DBDetector(DBDetectorConfig.tiny()).save_pretrained(directory / "det")
    CTCRecognizer(RecognizerConfig.tiny(len(charset) + 1), charset).save_pretrained(directory / "rec")
    return directory / "det", directory / "rec"


@needs_fonts
def test_quick_run_records_sampan_and_says_why_a_system_is_missing(tiny_set, tmp_path, monkeypatch):
    root, sets, _ = tiny_set
    monkeypatch.setenv("SAMPAN_HOME", str(tmp_path / "home"))  # Taskflow("ocr")'s export cache goes there
    det, rec = _tiny_sampan(tmp_path, Path(sets["clean"]["dir"]) / "charset.txt")
    out = tmp_path / "ocr.json"
    common = ["--quick", "--lines", "4", "--pages", "1", "--data", str(root), "--threads", "1", "--corpora", "sanguo",
              "--systems", "sampan", "--resamples", "50"]
    # Eager models: Taskflow("ocr") would export both to ONNX first (~50 s here); its own tests cover it.
    assert ocr.main([*common, "--sampan-engine", "eager", "--det", str(det), "--rec", str(rec), "--out", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["benchmark"] == "ocr" and result["machine"]["cpu_count"] and result["quick"]
    assert result["data"]["sets"]["clean"]["reused"]  # the fixture's build, found by its settings
    entry = result["systems"]["sampan"]
    assert entry["status"] == "measured"
    assert entry["model"]["model_bytes_total"] > 0 and entry["model"]["parameters"]["det"] > 0
    assert entry["model"]["page_engine"].startswith("PyTorch eager")
    assert entry["model"]["line_engine"].startswith("PyTorch eager")
    for condition in ("clean", "degraded"):
        scores = entry["lines"][condition]
        assert scores["lines"] == 4 and scores["char_accuracy"] <= 1.0 and 0 <= scores["exact_line_accuracy"] <= 1
    assert 0 <= entry["pages"]["detection"]["f1"] <= 1 and entry["pages"]["pages"] == 1
    assert entry["pages"]["detector_alone"]["gold_lines"] == entry["pages"]["detection"]["gold_lines"]
    assert entry["latency"]["line_ms_median"] > 0 and entry["latency"]["page_ms_median"] > 0
    assert result["sampan_minus"] == {"status": "measured"}  # no peer in this run

    # No models where --det / --rec point: recorded as not trained yet, with the way to build them.
    missing = tmp_path / "missing.json"
    ocr.main([*common, "--det", str(tmp_path / "none"), "--rec", str(tmp_path / "none"), "--out", str(missing)])
    entry = json.loads(missing.read_text(encoding="utf-8"))["systems"]["sampan"]
    assert entry["status"] == "not trained yet" and "sampan hub build ocr-rec-zh" in entry["reason"]


@pytest.mark.slow  # PP-OCRv4 reads a page in ~4 s and Tesseract in ~2.5 s on one thread
@needs_fonts
def test_peers_read_the_tiny_set_or_say_how_to_install_them(tiny_set):
    """Each peer either reads the clean lines well (the adapter feeds it the right pixels and parses
    its output) and finds the page's lines, or is refused with the install line; the test says which."""
    _, _, data = tiny_set
    measured = []
    for make, install in ((lambda: TesseractSystem("chi_sim", 1), "tesseract-ocr-chi-sim"),
                          (lambda: PPOCRSystem(1), "rapidocr-onnxruntime==1.4.4")):
        try:
            system = make()
        except Unavailable as exc:
            assert exc.status == "not installed" and install in exc.reason
            print(f"peer not installed here: {exc}")
            continue
        lines, _ = ocr.evaluate_lines(system, data, log=lambda m: None)
        pages = ocr.evaluate_pages(system, data, log=lambda m: None)
        assert lines["clean"]["char_accuracy"] > 0.5, (system.name, lines["clean"]["examples"])
        assert pages["detection"]["recall"] > 0.5 and pages["end_to_end"]["char_accuracy"] > 0.5, (system.name, pages)
        assert pages.get("detector_alone", {"recall": 1.0})["recall"] > 0.5, (system.name, pages)
        assert system.describe()["model_bytes_total"] > 1_000_000
        measured.append(system.name)
    print(f"peers measured: {measured or 'none'}")

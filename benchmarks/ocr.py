"""Chinese OCR, sampan vs Tesseract 5 (chi_sim) vs PP-OCRv4 (rapidocr-onnxruntime), in one run on
held-out rendered lines and pages.

The test set comes from the data engine (``sampan.vision.build``, what ``sampan data build-ocr``
runs): only its held-out fonts and the corpora's held-out documents, nothing a sampan model trained
on. Two builds share a seed and differ only in the line degradations: every line image is drawn from
its own generator and its text, font, size and colours are drawn before the degradations, so line
``i`` of both builds carries the same text (checked). The *clean* build has no line degradation;
the *degraded* one applies all of shrink (low resolution), rotation, blur, speckle (noise) and JPEG
to every line, at the engine's default strengths. Pages come from the clean build, with the
engine's default page degradations. Builds are cached under ``$SAMPAN_CACHE/bench-ocr/`` and reused
when their manifest's settings and versions match; the JSON records each manifest's SHA-256.

Measured for each system (a missing one is recorded with the reason and the install line):

1. line recognition, clean and degraded: character accuracy ``1 - sum(edits) / sum(reference
   characters)`` over the set, and exact-line accuracy (benchmarks/_ocr_metrics.py: text NFKC-folded,
   whitespace dropped; the strict variants beside them), with 95% paired-bootstrap intervals on
   sampan minus each peer;
2. page detection: precision / recall / F1 of line boxes at IoU >= 0.5 (convex quad IoU from
   ``sampan.vision.polygon``, one-to-one, highest IoU first);
3. end to end: page character accuracy, each detected box's text given to the gold line holding most
   of the box;
4. latency: per line image and per page, warm, median over interleaved calls (each system in turn on
   the same image) at ``--threads`` threads; model files' size on disk.

Usage::

    python benchmarks/ocr.py                              # -> benchmarks/results/ocr.json
    python benchmarks/ocr.py --threads 1                  # while trainers share the machine
    python benchmarks/ocr.py --quick --out /tmp/ocr.json  # 12 lines, 2 pages (< 60 s)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ocr_metrics import (  # noqa: E402
    detection_scores,
    iou_matrix,
    line_errors,
    line_scores,
    match,
    page_text_errors,
    paired_char_accuracy_difference,
)
from _ocr_systems import PPOCRSystem, SampanSystem, Sample, TesseractSystem, Unavailable  # noqa: E402

from _common import apply_presets, machine_info, timestamp, write_json_atomic  # noqa: E402
from _paired import paired_accuracy_difference  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "ocr.json"
SYSTEMS = ("sampan", "tesseract", "ppocr_v4")
DEFAULTS = {"lines": 500, "pages": 50, "latency_lines": 20, "latency_pages": 4, "latency_repeats": 3,
            "resamples": 2000}
QUICK = {"lines": 12, "pages": 2, "latency_lines": 3, "latency_pages": 1, "latency_repeats": 1, "resamples": 200}
IOU_THRESHOLD = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sampan.utils.paths import cache_dir, user_models_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=None, help="test line images, each clean and degraded (500)")
    parser.add_argument("--pages", type=int, default=None, help="test page images (50)")
    parser.add_argument("--seed", type=int, default=0, help="the data engine's seed")
    parser.add_argument("--corpora", default=None,
                        help="corpora the text is cut from, comma-separated (default: the data engine's)")
    parser.add_argument("--data", type=Path, default=None,
                        help="where the test builds are cached (default: $SAMPAN_CACHE/bench-ocr)")
    parser.add_argument("--det", type=Path, default=user_models_dir() / "ocr-det-zh",
                        help="sampan's detector directory (save_pretrained; default $SAMPAN_HOME/models/ocr-det-zh)")
    parser.add_argument("--rec", type=Path, default=user_models_dir() / "ocr-rec-zh",
                        help="sampan's recogniser directory (default $SAMPAN_HOME/models/ocr-rec-zh)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"which of {','.join(SYSTEMS)} to run")
    parser.add_argument("--sampan-engine", choices=("auto", "taskflow", "eager"), default="auto",
                        help='how sampan runs: Taskflow("ocr") (both models on ONNX Runtime, as PP-OCRv4), the eager '
                             "PyTorch models, or auto (Taskflow where this checkout has it)")
    parser.add_argument("--tesseract-lang", default="chi_sim", help="tesseract's -l (default chi_sim)")
    parser.add_argument("--threads", type=int, default=2, help="threads each system may use (default 2)")
    parser.add_argument("--latency-lines", type=int, default=None, help="line images timed per system (20)")
    parser.add_argument("--latency-pages", type=int, default=None, help="pages timed per system (4)")
    parser.add_argument("--latency-repeats", type=int, default=None, help="passes over the timed images (3)")
    parser.add_argument("--resamples", type=int, default=None, help="bootstrap resamples (2000)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 12 lines, 2 pages, few timings")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    args = apply_presets(args, QUICK if args.quick else DEFAULTS, DEFAULT_OUT)
    if args.data is None:
        args.data = cache_dir("bench-ocr")
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    args.corpora = tuple(c.strip() for c in args.corpora.split(",") if c.strip()) if args.corpora else None
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown --systems {unknown}; known: {', '.join(SYSTEMS)}")
    for name in ("lines", "pages", "threads", "latency_repeats", "resamples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


# -- the test set ------------------------------------------------------------------------------------
def degraded_augment():
    """Every line degradation the issue names, each applied to every line at the engine's default
    strength (perspective left out: it is not one of them)."""
    from sampan.vision.augment import AugmentConfig

    return AugmentConfig(rotate_prob=1.0, perspective_prob=0.0, lowres_prob=1.0, blur_prob=1.0, noise_prob=1.0,
                         jpeg_prob=1.0)


def set_configs(lines: int, pages: int, seed: int, root: Path, corpora: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The two builds' configs: ``clean`` (lines without degradation, and the pages) and
    ``degraded`` (the same lines, degraded), in a folder named by their settings' digest; ``corpora``
    (default: the engine's) is what the text is cut from."""
    import hashlib

    from sampan.utils.config import to_dict
    from sampan.vision.augment import AugmentConfig
    from sampan.vision.build import OcrDataConfig

    common = {"train_lines": 0, "train_pages": 0, "test_lines": lines, "seed": seed, "line_format": "png",
              **({"corpora": tuple(corpora)} if corpora else {})}
    configs = {"clean": OcrDataConfig(out="", test_pages=pages, line_augment=AugmentConfig.none(), **common),
               "degraded": OcrDataConfig(out="", test_pages=0, line_augment=degraded_augment(), **common)}
    digest = hashlib.sha256(json.dumps({k: _settings(to_dict(c)) for k, c in configs.items()},
                                       sort_keys=True).encode()).hexdigest()[:16]
    for name, config in configs.items():
        config.out = str(root / digest / name)
    return configs


def _settings(config: dict[str, Any]) -> dict[str, Any]:
    """A config's settings as the manifest stores them (JSON types; no output folder, no workers)."""
    return json.loads(json.dumps({k: v for k, v in config.items() if k not in ("out", "workers")}))


def build_sets(lines: int, pages: int, seed: int, root: Path, log=print,
               corpora: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """Build (or reuse) the clean and degraded test builds; returns ``name -> {dir, manifest, ...}``."""
    from sampan.utils.config import to_dict
    from sampan.utils.digest import file_sha256
    from sampan.vision.build import MANIFEST, _versions, build_ocr_data

    out = {}
    for name, config in set_configs(lines, pages, seed, root, corpora).items():
        directory = Path(config.out)
        manifest_path = directory / MANIFEST
        reused = False
        if manifest_path.is_file():
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            reused = manifest.get("settings") == _settings(to_dict(config)) and manifest.get("versions") == _versions()
        if reused:
            log(f"ocr: reusing the {name} build in {directory}")
        else:
            log(f"ocr: building the {name} test set in {directory}")
            build_ocr_data(config, log=lambda m: log(f"  {m}"))
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        test = manifest["splits"]["test"]
        out[name] = {"dir": str(directory), "manifest_sha256": file_sha256(manifest_path), "reused": reused,
                     "lines": test["lines"], "pages": test["pages"], "page_lines": test["page_lines"],
                     "fonts": test["fonts"], "fonts_text": ", ".join(test["fonts"]), "line_kinds": test["line_kinds"],
                     "augmented_lines": test["augmented_lines"], "documents_used": test["documents_used"],
                     "held_out": manifest["held_out"]}
    return out


def load_samples(sets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Line samples (clean, degraded) with their texts, and page samples with their gold lines."""
    from sampan.vision.build import read_records

    clean_dir, degraded_dir = Path(sets["clean"]["dir"]), Path(sets["degraded"]["dir"])
    clean = read_records(clean_dir, "test", "lines")
    degraded = read_records(degraded_dir, "test", "lines")
    texts = [r["text"] for r in clean]
    if texts != [r["text"] for r in degraded]:
        raise RuntimeError("the clean and degraded builds' lines carry different texts: the data engine no longer "
                           "draws a line's text before its degradations; pair them another way")
    pages = read_records(clean_dir, "test", "pages")
    return {"texts": texts, "kinds": [r["kind"] for r in clean],
            "clean": [Sample.load(clean_dir / "test" / r["image"]) for r in clean],
            "degraded": [Sample.load(degraded_dir / "test" / r["image"]) for r in degraded],
            "pages": [Sample.load(clean_dir / "test" / r["image"]) for r in pages],
            "page_gold": [[(np.asarray(ln["quad"]), ln["text"]) for ln in r["lines"]] for r in pages]}


# -- running the systems -------------------------------------------------------------------------------
def make_system(name: str, args: argparse.Namespace):
    if name == "sampan":
        return SampanSystem(args.det, args.rec, args.threads, args.sampan_engine)
    if name == "tesseract":
        return TesseractSystem(args.tesseract_lang, args.threads)
    return PPOCRSystem(args.threads)


def read_lines(system, samples: list[Sample]) -> list[str]:
    batch = getattr(system, "read_lines", None)
    return batch(samples) if batch is not None else [system.read_line(s) for s in samples]


def evaluate_lines(system, data: dict[str, Any], log) -> tuple[dict[str, Any], dict[str, Any]]:
    """Scores per condition, and the per-line errors the paired intervals need."""
    scores, errors = {}, {}
    for condition in ("clean", "degraded"):
        start = time.perf_counter()
        hyps = read_lines(system, data[condition])
        seconds = time.perf_counter() - start
        scores[condition] = {**line_scores(data["texts"], hyps), "pass_seconds": round(seconds, 2),
                             "examples": [{"reference": r, "read": h} for r, h in zip(data["texts"][:5], hyps[:5],
                                                                                     strict=True)]}
        errors[condition] = line_errors(data["texts"], hyps)
        log(f"  {system.name} {condition} lines: char accuracy {scores[condition]['char_accuracy']:.3f}, "
            f"exact {scores[condition]['exact_line_accuracy']:.3f} ({seconds:.1f} s)")
    return scores, errors


def evaluate_pages(system, data: dict[str, Any], log) -> dict[str, Any]:
    """Detection of the lines the system returns (after its own dropping of empty or unsure reads),
    end-to-end accuracy, and where the system can run its detector alone, that detector's boxes."""
    counts, raw_counts, edits, reference = [], [], 0, 0
    golds = [[q for q, _ in gold] for gold in data["page_gold"]]
    start = time.perf_counter()
    for sample, gold, gold_quads in zip(data["pages"], data["page_gold"], golds, strict=True):
        predicted = system.read_page(sample)
        ious = iou_matrix(gold_quads, [q for q, _ in predicted])
        counts.append((len(match(ious, IOU_THRESHOLD)), len(gold), len(predicted)))
        e, r = page_text_errors(gold, predicted, ious)
        edits, reference = edits + e, reference + r
    seconds = time.perf_counter() - start
    out = {"detection": detection_scores(counts), "iou_threshold": IOU_THRESHOLD,
           "end_to_end": {"char_accuracy": 1.0 - edits / reference, "edits": edits, "reference_characters": reference},
           "pages": len(counts), "pass_seconds": round(seconds, 2)}
    if hasattr(system, "detect_only"):
        for sample, gold_quads in zip(data["pages"], golds, strict=True):
            boxes = system.detect_only(sample)
            raw_counts.append((len(match(iou_matrix(gold_quads, boxes), IOU_THRESHOLD)), len(gold_quads), len(boxes)))
        out["detector_alone"] = detection_scores(raw_counts)
    d = out["detection"]
    log(f"  {system.name} pages: P {d['precision']:.3f} R {d['recall']:.3f} F1 {d['f1']:.3f}"
        + (f" (detector alone F1 {out['detector_alone']['f1']:.3f})" if raw_counts else "")
        + f", end-to-end char accuracy {out['end_to_end']['char_accuracy']:.3f} ({seconds:.1f} s)")
    return out


def measure_latency(systems: dict[str, Any], data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Median seconds per line image and per page, warm (the scoring passes ran before): ``repeats``
    passes over the same images, the systems taking turns on each image (their order rotating), so
    load from other jobs falls on all of them alike."""
    out: dict[str, Any] = {name: {} for name in systems}
    for kind, samples, call in (("line", data["clean"][: args.latency_lines], "read_line"),
                                ("page", data["pages"][: args.latency_pages], "read_page")):
        able = {n: s for n, s in systems.items() if kind == "line" or s.reads_pages}
        if not samples or not able:
            continue
        times: dict[str, list[float]] = {n: [] for n in able}
        names = list(able)
        for r in range(args.latency_repeats):
            for i, sample in enumerate(samples):
                shift = (r * len(samples) + i) % len(names)
                for name in names[shift:] + names[:shift]:
                    start = time.perf_counter()
                    getattr(able[name], call)(sample)
                    times[name].append(time.perf_counter() - start)
        for name, seconds in times.items():
            out[name][f"{kind}_ms_median"] = 1000 * statistics.median(seconds)
            out[name][f"{kind}_timed_calls"] = len(seconds)
    return out


def differences(errors: dict[str, dict[str, Any]], resamples: int) -> dict[str, Any]:
    """sampan minus each peer on the same lines: character and exact-line accuracy, 95% intervals
    (``status`` "measured"; without sampan's figures, the status its entry has)."""
    if "sampan" not in errors:
        return {"status": "not trained yet"}
    out: dict[str, Any] = {"status": "measured"}
    for peer in (n for n in errors if n != "sampan"):
        out[peer] = {}
        for condition in ("clean", "degraded"):
            a, b = errors["sampan"][condition], errors[peer][condition]
            out[peer][condition] = {
                "char_accuracy": paired_char_accuracy_difference(a["edits"], b["edits"], a["lengths"],
                                                                 resamples=resamples),
                "exact_line_accuracy": paired_accuracy_difference(a["exact"], b["exact"], resamples=resamples)}
    return out


def _cell(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "—"


def print_table(systems: dict[str, Any]) -> None:
    print(f"{'system':<12} {'clean CA':>9} {'exact':>6} {'degr. CA':>9} {'exact':>6} {'det P':>6} {'R':>6} "
          f"{'F1':>6} {'e2e CA':>7} {'ms/line':>8} {'ms/page':>8} {'MB':>6}")
    for name, entry in systems.items():
        if entry["status"] != "measured":
            print(f"{name:<12} {entry['status']}: {entry['reason']}")
            continue
        lines, pages, lat = entry.get("lines", {}), entry.get("pages", {}), entry.get("latency", {})
        det = pages.get("detection", {})
        print(f"{name:<12} {_cell(lines['clean']['char_accuracy'], '.3f'):>9} "
              f"{_cell(lines['clean']['exact_line_accuracy'], '.3f'):>6} "
              f"{_cell(lines['degraded']['char_accuracy'], '.3f'):>9} "
              f"{_cell(lines['degraded']['exact_line_accuracy'], '.3f'):>6} {_cell(det.get('precision'), '.3f'):>6} "
              f"{_cell(det.get('recall'), '.3f'):>6} {_cell(det.get('f1'), '.3f'):>6} "
              f"{_cell(pages.get('end_to_end', {}).get('char_accuracy'), '.3f'):>7} "
              f"{_cell(lat.get('line_ms_median'), '.1f'):>8} {_cell(lat.get('page_ms_median'), '.0f'):>8} "
              f"{_cell(entry['model']['model_bytes_total'] / 1e6, '.1f'):>6}")


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    started, machine = time.perf_counter(), machine_info()  # the load average as the run begins
    sets = build_sets(args.lines, args.pages, args.seed, args.data, log, args.corpora)
    data = load_samples(sets)
    systems, results, errors = {}, {}, {}
    for name in args.systems:
        try:
            systems[name] = make_system(name, args)
        except Unavailable as exc:
            results[name] = {"status": exc.status, "reason": exc.reason}
            log(f"ocr: {name} {exc.status}: {exc.reason}")
    for name, system in systems.items():
        model = system.describe()
        results[name] = {"status": "measured", "model": {**model, "model_mb": model["model_bytes_total"] / 1e6}}
        results[name]["lines"], errors[name] = evaluate_lines(system, data, log)
        if system.reads_pages:
            results[name]["pages"] = evaluate_pages(system, data, log)
        else:
            results[name]["pages"] = {"status": "not trained yet", "reason": f"no detector in {args.det}"}
    latency = measure_latency(systems, data, args)
    for name in systems:
        # The set pass's mean per line: for Tesseract, which reads the set in one process, this is
        # the warm figure (its single-image calls each start a process and load the model).
        pass_ms = 1000 * results[name]["lines"]["clean"]["pass_seconds"] / len(data["texts"])
        results[name]["latency"] = {**latency[name], "line_ms_set_pass_mean": pass_ms}
    return {
        "benchmark": "ocr", "timestamp": timestamp(), "machine": machine, "threads": args.threads,
        "quick": args.quick, "command": "python benchmarks/ocr.py " + " ".join(sys.argv[1:]),
        "data": {"seed": args.seed, "sets": sets,
                 "degraded_lines": "every line shrunk (low resolution), rotated, blurred, speckled (noise) and "
                                   "JPEG-compressed, at the data engine's default strengths (AugmentConfig)",
                 "pairing": "two builds with one seed; a line's text is drawn before its degradations, so line i "
                            "of both carries the same text (checked)"},
        "scoring": {"text": "NFKC-folded, whitespace removed (the _strict fields: as written, ends stripped)",
                    "char_accuracy": "1 - sum(edit distance) / sum(reference characters), over the set",
                    "detection": f"the lines each system returns, one-to-one matches at quad IoU >= {IOU_THRESHOLD}, "
                                 "highest first, micro over pages; detector_alone: the same for the detector's own "
                                 "boxes, before the system drops empty or unsure reads",
                    "end_to_end": "each detected box's text goes to the gold line holding at least half the box's "
                                  "area; a line's boxes joined left to right; unmatched lines cost their length, "
                                  "unmatched boxes their text",
                    "differences": "sampan minus the peer, 95% paired bootstrap over lines",
                    "latency": "warm, median of interleaved single-image calls"},
        "systems": results,
        "sampan_minus": differences(errors, args.resamples) if "sampan" in errors else
        {"status": results["sampan"]["status"] if "sampan" in results else "not run"},
        "seconds": round(time.perf_counter() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_table(result["systems"])
    write_json_atomic(args.out, result)
    print(f"wrote {args.out} ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

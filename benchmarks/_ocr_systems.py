"""The three OCR systems of ``benchmarks/ocr.py`` behind one interface: a line image to text, a page
image to ``[(quad, text)]``, and the bytes of the model files they read.

- sampan: ``Taskflow("ocr")`` where that task exists (both models exported and run by ONNX Runtime,
  as PP-OCRv4 is): its ``recognize`` for line images, the whole task for pages; else the eager
  PyTorch models from their ``save_pretrained`` directories (``recognize`` for lines; ``detect``,
  each box cropped upright, the crops read in one batch, for pages);
- Tesseract 5 (``chi_sim``) through its command line: ``--psm 7`` (one text line) for line images,
  its default page segmentation for pages, line boxes from its TSV output;
- PP-OCRv4 through ``rapidocr-onnxruntime`` (ONNX Runtime): its recogniser alone on line images,
  detector + recogniser on pages (the 180-degree direction classifier off, as sampan has none).

A system that cannot run here raises :class:`Unavailable` with what to do, and the benchmark records
that instead of figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

TESSERACT_INSTALL = "apt-get install tesseract-ocr tesseract-ocr-chi-sim (or: make bench-deps)"
RAPIDOCR_INSTALL = "pip install -e '.[bench]' (rapidocr-onnxruntime==1.4.4; or: make bench-deps)"


class Unavailable(RuntimeError):
    """A system that cannot be measured here: ``status`` ("not installed", "not trained yet") and
    ``reason`` (what is missing and how to get it)."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


@dataclasses.dataclass
class Sample:
    """One image of the test set: its file (for the command-line peer) and its RGB pixels."""

    path: Path
    image: Image.Image

    @classmethod
    def load(cls, path: Path) -> Sample:
        with Image.open(path) as im:
            return cls(path, im.convert("RGB"))


def _dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def crop_quad(image: Image.Image, quad: np.ndarray) -> Image.Image:
    """The quadrilateral ``quad`` (top-left, top-right, bottom-right, bottom-left) warped to an
    upright rectangle as wide and tall as its longer opposite sides."""
    q = np.asarray(quad, dtype=np.float64)
    width = max(1, int(round(max(np.linalg.norm(q[0] - q[1]), np.linalg.norm(q[3] - q[2])))))
    height = max(1, int(round(max(np.linalg.norm(q[0] - q[3]), np.linalg.norm(q[1] - q[2])))))
    # PIL's QUAD takes the source corners upper-left, lower-left, lower-right, upper-right.
    data = tuple(float(v) for v in np.concatenate([q[0], q[3], q[2], q[1]]))
    return image.transform((width, height), Image.Transform.QUAD, data, Image.Resampling.BILINEAR)


# -- sampan -------------------------------------------------------------------------------------------
def find_model_dir(directory: Path, model_type: str) -> Path | None:
    """``directory`` if its ``config.json`` names ``model_type``, else the one child folder whose does
    (a recipe may write the model one level down); None when there is none."""

    def holds(d: Path) -> bool:
        try:
            return json.loads((d / "config.json").read_text(encoding="utf-8")).get("model_type") == model_type
        except (OSError, ValueError, AttributeError):
            return False

    if holds(directory):
        return directory
    found = [d for d in sorted(directory.iterdir()) if d.is_dir() and holds(d)] if directory.is_dir() else []
    return found[0] if len(found) == 1 else None


class SampanSystem:
    """sampan's detector and recogniser, read from their directories (either may be missing: the
    figures that need it are then recorded as not trained yet)."""

    name = "sampan"

    def __init__(self, det_dir: Path, rec_dir: Path, threads: int, engine: str = "auto") -> None:
        import torch

        from sampan.vision.det_db import MODEL_TYPE as DET_TYPE
        from sampan.vision.det_db import DBDetector
        from sampan.vision.rec_ctc import MODEL_TYPE as REC_TYPE
        from sampan.vision.rec_ctc import CTCRecognizer

        torch.set_num_threads(threads)
        det, rec = find_model_dir(det_dir, DET_TYPE), find_model_dir(rec_dir, REC_TYPE)
        self.missing = {k: str(d) for k, d, found in (("det", det_dir, det), ("rec", rec_dir, rec)) if found is None}
        if rec is None:
            raise Unavailable("not trained yet", f"no recogniser ({REC_TYPE}) in {rec_dir}"
                              + (f" and no detector ({DET_TYPE}) in {det_dir}" if det is None else "")
                              + ": build them with `sampan hub build ocr-rec-zh` / `ocr-det-zh`, or pass --det / --rec")
        self.det_dir, self.rec_dir = det, rec
        self.rec = CTCRecognizer.from_pretrained(rec).eval()
        self.det = DBDetector.from_pretrained(det).eval() if det is not None else None
        self.taskflow, self.page_engine = None, "PyTorch eager: DBDetector.detect, crop_quad, CTCRecognizer.recognize"
        self.line_engine = "PyTorch eager: CTCRecognizer.recognize"
        if engine not in ("auto", "taskflow", "eager"):
            raise ValueError(f"engine must be auto, taskflow or eager, got {engine!r}")
        if det is not None and engine != "eager":
            from sampan.taskflow import Taskflow
            from sampan.taskflow.registry import TASKS

            if "ocr" in TASKS:
                self.taskflow = Taskflow("ocr", det_model=str(det), rec_model=str(rec), num_threads=threads)
                self.page_engine = 'Taskflow("ocr"): exported det + rec through the inference predictor'
                self.line_engine = 'Taskflow("ocr").task.recognize: the exported rec through the inference predictor'
            elif engine == "taskflow":
                raise Unavailable("not installed", 'this checkout has no Taskflow("ocr"); use --sampan-engine eager')

    @property
    def reads_pages(self) -> bool:
        return self.det is not None

    def read_line(self, sample: Sample) -> str:
        if self.taskflow is not None:
            return self.taskflow.task.recognize([np.asarray(sample.image)])[0][0]
        return self.rec.recognize([sample.image])[0].text

    def read_page(self, sample: Sample) -> list[tuple[np.ndarray, str]]:
        if self.det is None:
            raise Unavailable("not trained yet", f"no detector in {self.missing['det']}")
        if self.taskflow is not None:
            return [(np.asarray(r["box"], dtype=np.float64), r["text"]) for r in self.taskflow(sample.image)]
        boxes = self.det.detect(sample.image)
        if not boxes:
            return []
        texts = [r.text for r in self.rec.recognize([crop_quad(sample.image, b.quad) for b in boxes])]
        return [(b.quad, t) for b, t in zip(boxes, texts, strict=True)]

    def detect_only(self, sample: Sample) -> list[np.ndarray]:
        """The detector's boxes before any reading (Taskflow drops a box whose text reads empty)."""
        if self.taskflow is not None:
            return [b.quad for b in self.taskflow.task.detect(np.asarray(sample.image))]
        return [b.quad for b in self.det.detect(sample.image)]

    def describe(self) -> dict[str, Any]:
        files = {"rec": str(self.rec_dir), **({"det": str(self.det_dir)} if self.det_dir is not None else {})}
        sizes = {k: _dir_bytes(Path(v)) for k, v in files.items()}
        params = {"rec": sum(p.numel() for p in self.rec.parameters())}
        if self.det is not None:
            params["det"] = sum(p.numel() for p in self.det.parameters())
        cards = {}  # which checkpoint was measured: the store card a recipe writes beside the model
        for k, v in files.items():
            card = Path(v) / "card.json"
            if card.is_file():
                cards[k] = json.loads(card.read_text(encoding="utf-8")).get("metrics", {})
        return {"line_engine": self.line_engine, "page_engine": self.page_engine, "cards": cards,
                "model_dirs": files, "model_bytes": sizes, "model_bytes_total": sum(sizes.values()),
                "parameters": params}


# -- Tesseract ----------------------------------------------------------------------------------------
class TesseractSystem:
    """The ``tesseract`` command (one process per image; ``read_lines`` reads a list in one process)."""

    name = "tesseract"
    reads_pages = True

    def __init__(self, lang: str, threads: int) -> None:
        exe = shutil.which("tesseract")
        if exe is None:
            raise Unavailable("not installed", f"no tesseract on PATH: {TESSERACT_INSTALL}")
        listing = subprocess.run([exe, "--list-langs"], capture_output=True, text=True, check=False)
        text = listing.stdout + listing.stderr
        langs = set(text.split()[1:])
        missing = [part for part in lang.split("+") if part not in langs]
        if missing:
            raise Unavailable("not installed", f"tesseract has no {missing} language data: {TESSERACT_INSTALL}")
        where = re.search(r'"([^"]+)"', text)
        self.tessdata = Path(where.group(1)) if where else None
        self.exe, self.lang = exe, lang
        # Tesseract's OpenMP threads; the same count the other systems get.
        self.env = {**os.environ, "OMP_THREAD_LIMIT": str(threads)}
        self.version = subprocess.run([exe, "--version"], capture_output=True, text=True,
                                      check=False).stdout.splitlines()[0].strip()

    def _run(self, source: str, *args: str) -> str:
        done = subprocess.run([self.exe, source, "stdout", "-l", self.lang, *args], capture_output=True,
                              env=self.env, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"tesseract failed on {source}: {done.stderr.decode(errors='replace')[-500:]}")
        return done.stdout.decode("utf-8", errors="replace")

    def read_line(self, sample: Sample) -> str:
        return self._run(str(sample.path), "--psm", "7").strip()

    def read_lines(self, samples: list[Sample]) -> list[str]:
        """All lines in one process (a list file in, pages separated by form feeds out)."""
        with tempfile.TemporaryDirectory() as tmp:
            listing = Path(tmp) / "images.txt"
            listing.write_text("".join(f"{s.path.resolve()}\n" for s in samples), encoding="utf-8")
            pages = self._run(str(listing), "--psm", "7").split("\f")
        if len(pages) > len(samples) and not "".join(pages[len(samples):]).strip():
            pages = pages[: len(samples)]
        if len(pages) != len(samples):
            raise RuntimeError(f"tesseract returned {len(pages)} texts for {len(samples)} line images")
        return [p.strip() for p in pages]

    def read_page(self, sample: Sample) -> list[tuple[np.ndarray, str]]:
        """Line boxes (TSV level 4) with their words joined; automatic page segmentation (--psm 3)."""
        rows = self._run(str(sample.path), "--psm", "3", "tsv").splitlines()
        lines: dict[tuple[str, ...], dict] = {}
        for row in rows[1:]:
            cells = row.split("\t")
            if len(cells) < 12:
                continue
            level, key = cells[0], tuple(cells[1:5])
            left, top, width, height = (int(v) for v in cells[6:10])
            if level == "4":
                lines[key] = {"box": (left, top, left + width, top + height), "words": []}
            elif level == "5" and key in lines and cells[11].strip():
                lines[key]["words"].append(cells[11].strip())
        out = []
        for line in lines.values():
            if line["words"]:
                x0, y0, x1, y1 = line["box"]
                out.append((np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], dtype=np.float64),
                            " ".join(line["words"])))
        return out

    def describe(self) -> dict[str, Any]:
        files = {part: self.tessdata / f"{part}.traineddata" for part in self.lang.split("+")} if self.tessdata else {}
        sizes = {k: p.stat().st_size for k, p in files.items() if p.is_file()}
        return {"engine": self.version, "lang": self.lang, "line_mode": "--psm 7", "page_mode": "--psm 3 (TSV)",
                "model_files": {k: str(p) for k, p in files.items()}, "model_bytes": sizes,
                "model_bytes_total": sum(sizes.values())}


# -- PP-OCRv4 -----------------------------------------------------------------------------------------
class PPOCRSystem:
    """PP-OCRv4 (mobile det + rec) as ``rapidocr-onnxruntime`` ships it, run by ONNX Runtime."""

    name = "ppocr_v4"
    reads_pages = True

    def __init__(self, threads: int) -> None:
        try:
            import rapidocr_onnxruntime
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as exc:
            raise Unavailable("not installed", f"rapidocr_onnxruntime does not import ({exc}): {RAPIDOCR_INSTALL}") from None
        from importlib.metadata import version

        self.engine = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1, use_cls=False)
        self.models = Path(rapidocr_onnxruntime.__file__).parent / "models"
        self.version = version("rapidocr-onnxruntime")

    def read_line(self, sample: Sample) -> str:
        result, _ = self.engine(sample.image, use_det=False, use_cls=False, use_rec=True)
        return result[0][0] if result else ""

    def read_page(self, sample: Sample) -> list[tuple[np.ndarray, str]]:
        result, _ = self.engine(sample.image, use_cls=False)
        return [(np.asarray(box, dtype=np.float64), text) for box, text, _score in (result or [])]

    def detect_only(self, sample: Sample) -> list[np.ndarray]:
        """The detector's boxes before any reading (the full pipeline drops reads scored under 0.5)."""
        result, _ = self.engine(sample.image, use_cls=False, use_rec=False)
        return [np.asarray(box, dtype=np.float64) for box in (result or [])]

    def describe(self) -> dict[str, Any]:
        import onnxruntime

        files = {"det": self.models / "ch_PP-OCRv4_det_infer.onnx", "rec": self.models / "ch_PP-OCRv4_rec_infer.onnx"}
        sizes = {k: p.stat().st_size for k, p in files.items()}
        return {"engine": f"rapidocr-onnxruntime {self.version}, onnxruntime {onnxruntime.__version__}",
                "model_files": {k: p.name for k, p in files.items()}, "model_bytes": sizes,
                "model_bytes_total": sum(sizes.values()), "direction_classifier": "off"}

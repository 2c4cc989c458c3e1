"""``sampan export``: a saved model directory -> an inference directory (``sampan.inference``)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from sampan.commands import set_handler


@dataclasses.dataclass
class ExportOptions:
    """What to export, where to, and where to check it.

    Fields:
        model_dir: a directory written by save_pretrained or `sampan finetune` (either --save layout),
            or a stored model's name (`sampan hub list`).
        out: the inference directory to write (atomically).
        overwrite: replace an existing OUT.
        device: where the exported programs are checked against the eager model: cpu, auto, cuda or
            cuda:N. The export itself is traced on the CPU in float32 either way, so OUT runs on any
            device; with a GPU the .pt2 is checked on it, and the .onnx too when ONNX Runtime has its
            CUDA provider (onnxruntime-gpu), else on the CPU. The printed checked_on says where each ran.
    """

    model_dir: str
    out: str
    overwrite: bool = False
    device: str = "cpu"


def run(args: argparse.Namespace) -> int:
    from sampan.inference import export_model_dir
    from sampan.inference.pretrained import verify_devices
    from sampan.utils.flags import dataclass_from_args

    options = dataclass_from_args(ExportOptions, args)
    checked_on = verify_devices(options.device)  # before the model loads: a GPU that is not there fails at once
    out = export_model_dir(options.model_dir, options.out, overwrite=options.overwrite,  # an existing OUT: error
                           verify_device=options.device)
    meta = json.loads((out / "inference.json").read_text(encoding="utf-8"))
    if not (out / "inference.onnx").is_file():
        del checked_on["onnxruntime"]  # the ONNX exporter failed; inference.json says why
    print(json.dumps({"out": str(out), "files": sorted(p.name for p in out.iterdir()),
                      "inputs": [i["name"] for i in meta["inputs"]], "outputs": [o["name"] for o in meta["outputs"]],
                      "checked_on": checked_on}, indent=2))
    return 0


def register(subparsers) -> None:
    export = subparsers.add_parser(
        "export", help="export a saved model for inference (ONNX + torch.export, checked against eager)",
        description="Load a sampan model (a save_pretrained directory: config.json + model.safetensors; a "
                    "`sampan finetune` output in either --save layout; or a stored model's name from `sampan hub "
                    "list`: ERNIE sequence / token classification, ERNIE masked LM or GPT causal LM), export it "
                    "with dynamic batch and sequence to OUT/inference.onnx + inference.pt2 + inference.json, check "
                    "both against the eager model at several shapes, and copy tokenizer.json / task.json / "
                    "config.json along. Run it with sampan.inference.create_predictor(Config(OUT)). Details: "
                    "docs/inference.md.",
        epilog="example:  sampan export --model-dir outputs/sentiment --out outputs/sentiment-inference")
    from sampan.utils.flags import add_dataclass_args

    add_dataclass_args(export, ExportOptions, metavars={"model_dir": "DIR_OR_NAME", "out": "DIR"})
    set_handler(export, run)

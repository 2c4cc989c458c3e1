"""``sampan export``: a saved model directory -> an inference directory (``sampan.inference``)."""

from __future__ import annotations

import argparse
import json

from sampan.commands import set_handler


def run(args: argparse.Namespace) -> int:
    from sampan.inference import export_model_dir
    from sampan.inference.pretrained import verify_devices

    checked_on = verify_devices(args.device)  # before the model loads: a GPU that is not there fails at once
    out = export_model_dir(args.model_dir, args.out, overwrite=args.overwrite,  # an existing OUT: FileExistsError
                           verify_device=args.device)
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
    export.add_argument("--model-dir", required=True,
                        help="a directory written by save_pretrained or `sampan finetune` (either --save layout), "
                             "or a stored model's name (`sampan hub list`)")
    export.add_argument("--out", required=True, help="the inference directory to write (atomically)")
    export.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    export.add_argument("--device", default="cpu",
                        help="where the exported programs are checked against the eager model: cpu, auto, cuda or "
                             "cuda:N. The export itself is traced on the CPU in float32 either way, so OUT runs on "
                             "any device; with a GPU the .pt2 is checked on it, and the .onnx too when ONNX Runtime "
                             "has its CUDA provider (onnxruntime-gpu), else on the CPU. The printed checked_on says "
                             "where each ran (default: cpu)")
    set_handler(export, run)

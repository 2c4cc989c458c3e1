"""``sampan models``: the model zoo's named configs with parameter counts, and the families."""

from __future__ import annotations

import argparse
import json

from sampan.commands import set_handler
from sampan.utils.flags import add_dataclass_args
from sampan.utils.output import Output


def run(args: argparse.Namespace) -> int:
    from sampan.models import get_config, list_models
    from sampan.models.registry import FAMILIES
    from sampan.utils.flags import dataclass_from_args

    rows = []
    for name in list_models():
        config = get_config(name)
        rows.append({"name": name, "family": config.model_type, "parameters": config.num_parameters(),
                     "layers": config.num_layers, "hidden": config.hidden_size, "heads": config.num_heads,
                     "kv_heads": config.num_kv_heads, "vocab": config.vocab_size,
                     "max_len": config.max_position_embeddings})
    families = [{"family": spec.family, "heads": list(spec.heads), "hf_model_types": list(spec.hf_model_types),
                 "summary": spec.summary} for spec in FAMILIES.values()]
    if dataclass_from_args(Output, args).json:
        print(json.dumps({"models": rows, "families": families}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="sampan model zoo (shapes; `sampan.models.create(name)` builds one)")
    columns = ("name", "family", "parameters", "layers", "hidden", "heads", "kv_heads", "vocab", "max_len")
    for col in columns:
        table.add_column(col, justify="left" if col in ("name", "family") else "right")
    for row in rows:
        n = row["parameters"]
        size = f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
        table.add_row(row["name"], row["family"], size, *(str(row[k]) for k in columns[3:]))
    console = Console()
    console.print(table)
    fams = Table(title="families (`create(name, head=...)`; `from_pretrained` opens these Hugging Face model_types)")
    for col in ("family", "heads (first = default)", "HF model_type", "what it is"):
        fams.add_column(col, overflow="fold")
    for fam in families:
        fams.add_row(fam["family"], ", ".join(fam["heads"]), ", ".join(fam["hf_model_types"]), fam["summary"])
    console.print(fams)
    return 0


def register(subparsers) -> None:
    models = subparsers.add_parser("models", help="list the model zoo's named configs with parameter counts",
                                   description="List registered model configs (closed-form parameter counts).")
    add_dataclass_args(models, Output)
    set_handler(models, run)

"""Character masking vs ERNIE knowledge masking at ernie-mini's scale, 2 seeds (issue 39, item 2).

``benchmarks/knowledge_masking.py`` made this comparison at ernie-tiny's scale (4 x 256, 600 steps
of People's Daily), where knowledge masking showed no gain at either seed
(``results/knowledge_masking.json``, ``knowledge_masking_seed1.json``). This repeats it at the
shape and data of the ``ernie-mini-zh`` recipe (6 x 384, news + 三国演义 + reviews + debian-zh,
batch 32 x 128): four runs, ``char`` and ``knowledge`` masking at seeds 0 and 1, equal in everything
else (a seed fixes the initial weights and the data order for both maskings).

Each run IS the recipe (``sampan hub build ernie-mini-zh`` with ``pretrain.masking``,
``pretrain.training.seed`` and ``pretrain.training.max_steps`` set), so it resumes the same way:
its work dir is one per settings, ``--max-minutes`` ends this sitting with every run checkpointed,
and the same command continues where the last sitting stopped (finished runs are read back from
their cards, not rerun). Each is scored as the recipe scores: held-out MLM loss (fixed char-level
masking of 256 held-out rows), char MLM accuracy (512 rows) and whole-entity cloze (1,000 gold
entities of held-out People's Daily).

Budget: 1,200 steps per run by default. At the 3.4 s of CPU one ernie-mini step takes at 1 thread
alone (batch 32 x 128, measured for the recipe; 4.4 s with the other core busy), the 4 runs cost
4 x 1,200 x 3.4 s = 16,300 s = 4.5 hours of one core; 1,200 steps is ~1 pass over the 41K packed
rows, where ernie-tiny's held-out loss had already flattened, and 40% of the recipe's
3,000. The recorded result (results/masking_scale.json) is at ``--steps 600``, its four arms run over
two sessions on one machine. Unfinished runs resume within a machine only: their checkpoints live
under ``$SAMPAN_HOME/build``, and ``--collect`` writes the result from whichever arms finished.

Run (one sitting, resumable):
    nohup nice -n 10 env OMP_NUM_THREADS=1 python benchmarks/masking_scale.py --max-minutes 80 \\
        > /work/runs/masking-scale.log 2>&1 &
Tiny check (seconds; writes to --out only):
    python benchmarks/masking_scale.py --quick --work-dir /tmp/ms --out /tmp/ms/masking_scale.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from _common import command_line, load_average, machine_info, set_threads, timestamp, write_json_atomic
from sampan.hub import recipes
from sampan.utils.config import to_dict

RECIPE = "ernie-mini-zh"
MASKINGS = ("char", "knowledge")
FIGURES = ("heldout_mlm_loss", "heldout_char_mlm_accuracy", "heldout_entity_cloze_accuracy")
# --quick: a 1-layer, 32-wide model on 12 People's Daily documents (lexicon entities: no LAC).
QUICK = ["data.corpora=news", "data.max_docs=12", "data.entities=lexicon", "data.vocab_size=800", "data.seq_len=64",
         "pretrain.model.overrides.num_layers=1", "pretrain.model.overrides.hidden_size=32",
         "pretrain.model.overrides.num_heads=2", "pretrain.model.overrides.intermediate_size=64",
         "pretrain.training.per_device_train_batch_size=4", "pretrain.training.warmup_steps=1",
         "pretrain.eval_rows=8", "pretrain.training.progress_bar=false"]


def run_settings(masking: str, seed: int, steps: int, extra: list[str]) -> list[str]:
    """The recipe's ``--set`` pairs of one run: the masking, the seed, the steps and a warmup of 5%
    (the recipe's share), with a save and an eval every tenth of the run."""
    return [f"pretrain.masking={masking}", f"pretrain.training.seed={seed}", f"pretrain.training.max_steps={steps}",
            f"pretrain.training.warmup_steps={max(1, steps // 20)}",
            f"pretrain.training.save_steps={max(1, steps // 10)}", f"pretrain.training.eval_steps={max(1, steps // 10)}",
            *extra]


def finished_card(out_root: Path, pairs: list[str]) -> dict | None:
    """The stored card of a run already finished with exactly these settings, else None."""
    card_path = out_root / RECIPE / "card.json"
    if not card_path.is_file():
        return None
    card = json.loads(card_path.read_text(encoding="utf-8"))
    stored = {k: v for k, v in card["settings"].items() if k != "build_seconds"}
    wanted = to_dict(recipes.parse_settings(recipes.RECIPES[RECIPE].settings, pairs))
    for settings in (stored, wanted):  # the last sitting's length is no setting of the run
        settings["pretrain"]["training"].pop("max_minutes", None)
    return card if stored == wanted else None


def progress(pairs: list[str]) -> str:
    """An unfinished run's state: "in progress: step N" (its newest checkpoint) or "not started"."""
    settings = recipes.parse_settings(recipes.RECIPES[RECIPE].settings, pairs)
    steps = [int(p.name.rsplit("-", 1)[1]) for p in recipes.run_dir(RECIPE, settings).glob("checkpoint-*")]
    return f"in progress: step {max(steps)}" if steps else "not started"


def summarize(runs: dict[str, dict]) -> dict:
    """Per masking, each figure's mean over the finished seeds; per seed, knowledge minus char."""
    out: dict = {"mean": {}, "knowledge_minus_char": {}}
    for masking in MASKINGS:
        done = [r for r in runs.values() if r["masking"] == masking and r["status"] == "done"]
        if done:
            out["mean"][masking] = {f: statistics.fmean(r["metrics"][f] for r in done) for f in FIGURES}
            out["mean"][masking]["seeds"] = len(done)
    for name, run in runs.items():
        if run["masking"] != "knowledge" or run["status"] != "done":
            continue
        char = runs.get(name.replace("knowledge", "char"))
        if char and char["status"] == "done":
            out["knowledge_minus_char"][f"seed{run['seed']}"] = {
                f: run["metrics"][f] - char["metrics"][f] for f in FIGURES}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1200, help="steps of each run (fixes its LR schedule)")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--max-minutes", type=float, default=0.0,
                        help="stop this sitting after this many minutes, every run checkpointed (0 = no limit)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="more recipe settings for every run (as `sampan hub build ernie-mini-zh --set`)")
    parser.add_argument("--work-dir", default="outputs/bench/masking_scale", help="where each run's model is stored")
    parser.add_argument("--collect", action="store_true",
                        help="start no run: write the result from the runs already finished (the others as not done)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="a tiny run of every piece (for a check)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "masking_scale.json"))
    args = parser.parse_args(argv)
    set_threads(args.threads)
    extra = list(args.set)
    if args.quick:
        args.steps = min(args.steps, 6)
        extra = QUICK + extra
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    started = time.perf_counter()
    result = {
        "benchmark": "masking_scale", "timestamp": timestamp(), "machine": machine_info(),
        "load_average_start": load_average(), "command": command_line(argv),
        "recipe": RECIPE, "steps": args.steps, "seeds": seeds, "extra_settings": extra, "runs": {},
    }
    paused = False
    for seed in seeds:
        for masking in MASKINGS:
            name = f"{masking}-seed{seed}"
            pairs = run_settings(masking, seed, args.steps, extra)
            out_root = Path(args.work_dir) / name
            run = {"masking": masking, "seed": seed, "steps": args.steps}
            card = finished_card(out_root, pairs)
            if card is None and not paused and not args.collect:
                left = args.max_minutes - (time.perf_counter() - started) / 60 if args.max_minutes else 0.0
                if args.max_minutes and left <= 0:
                    paused = True
                else:
                    budget = [f"pretrain.training.max_minutes={left:.3f}"] if args.max_minutes else []
                    print(f"masking_scale: {name} ({args.steps} steps)", flush=True)
                    recipes.build(RECIPE, pairs + budget, out_root=out_root)
                    card = finished_card(out_root, pairs)
                    paused = card is None
            if card is None:
                run["status"] = progress(pairs)
            else:
                run.update(status="done", metrics={f: card["metrics"][f] for f in (*FIGURES, "steps", "parameters")},
                           build_seconds=card["settings"].get("build_seconds"))
            result["runs"][name] = run
    result["summary"] = summarize(result["runs"])
    result["load_average_end"] = load_average()
    write_json_atomic(args.out, result)
    print_table(result)
    print(f"wrote {args.out}" + ("; rerun the same command to continue" if paused else ""))
    return result


def print_table(result: dict) -> None:
    rows = [("run", "status", "MLM loss", "char MLM", "entity cloze")]
    for name, r in result["runs"].items():
        m = r.get("metrics")
        rows.append((name, r["status"], *(("-",) * 3 if m is None else (
            f"{m['heldout_mlm_loss']:.3f}", f"{m['heldout_char_mlm_accuracy']:.2%}",
            f"{m['heldout_entity_cloze_accuracy']:.2%}"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()

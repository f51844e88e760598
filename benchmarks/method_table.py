"""Every registered method on the embedded all-MiniLM-L6-v2, over seeds: the 7-STS average after training (mean ±
sample std), the training time per step, and the paper's own BERT-base figure beside it.

    HF_SENTCL_DATA=/path/to/senteval python benchmarks/method_table.py [--seeds 1,2,3] [--max-steps 64]
        [--methods simcse,...] [--output-dir outputs/method_table] [--table docs/method_table.md]

Each method trains from its own MiniLM recipe (its pooling, head, batch, learning rate and method keys) with only
the data and the budget made the same: the shared Wikipedia subset (`$HF_SENTCL_DATA/../wiki1m_subset.txt`) for
the unsupervised methods, SNLI's dev+test pairs of the data folder for the NLI-supervised ones (supervised SimCSE:
(premise, entailment, contradiction) triplets built from them here), STS-B train for AnglE (with its scores) and
SG-OPT (its texts, the recipe's own), and `--max-steps` optimizer steps for every method. Each method runs through
`hf-sentcl sweep RECIPE --seeds ...` (one process, this CPU), which reuses finished runs on a rerun.

The paper's figure is not comparable with ours: another model (BERT-base), the full training data and budget, and
for several methods another evaluation detail; the table says so.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from hf_sentcl.registry import METHODS, PAPERS

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"

#: label -> (MiniLM recipe, the data it is pointed at, the method (or plug-in paper) and the setting whose reported
#: BERT-base figure stands beside the row: `Paper.reported` of its registration; None where none is entered)
ROWS: dict[str, tuple[str, str, str, str | None]] = {
    "simcse": ("quickstart.yaml", "wiki", "simcse", "unsup-SimCSE-BERT-base"),
    "simcse_sup": ("simcse_sup_minilm.yaml", "triplets", "simcse_sup", "sup-SimCSE-BERT-base"),
    "self_guided (SG-OPT)": ("sg_opt_minilm.yaml", "recipe", "self_guided", "BERT-base SG-OPT"),
    "consert (unsup)": ("consert_minilm.yaml", "recipe", "consert", "ConSERT-base (unsup)"),
    "consert (joint)": ("consert_minilm_joint.yaml", "recipe", "consert", "ConSERT-base (joint)"),
    "clear": ("clear_minilm.yaml", "wiki", "clear", "CLEAR-base"),
    "simcse + BYOP-C": ("byop_minilm.yaml", "wiki", "byop", "BERT-base +BYOPC"),
    "angle": ("angle_minilm.yaml", "recipe", "angle", None),  # the paper's BERT-base table was not read here
    "esimcse": ("esimcse_minilm.yaml", "wiki", "esimcse", "ESimCSE-BERT-base"),
    "promptbert": ("promptbert_minilm.yaml", "wiki", "promptbert", "unsup-PromptBERT-BERT-base"),
}


def reported(label: str) -> tuple[float | None, str]:
    """The row's reported BERT-base figure and its source, from the method's (or plug-in's) registered paper."""
    _, _, owner, setting = ROWS[label]
    if setting is None:
        return None, "not entered: the paper's BERT-base table was not read here"
    paper = METHODS[owner].paper if owner in METHODS else PAPERS[owner]
    figure = paper.figure(setting)
    return figure.avg, f"{figure.source}, {figure.setting}"


def snli_triplets(data_dir: Path, path: Path) -> Path:
    """(premise, entailment, contradiction) rows from SNLI's dev and test pairs in the SentEval folder: every premise
    with both an entailed and a contradicted hypothesis, its first of each."""
    hypotheses: dict[str, dict[str, str]] = defaultdict(dict)
    for split in ("dev", "test"):
        folder = data_dir / "SNLI"
        premises = (folder / f"s1.{split}").read_text().splitlines()
        others = (folder / f"s2.{split}").read_text().splitlines()
        labels = (folder / f"labels.{split}").read_text().splitlines()
        for premise, other, label in zip(premises, others, labels):
            hypotheses[premise].setdefault(label.strip(), other)
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["sent0", "sent1", "hard_neg"])
        writer.writerows((p, h["entailment"], h["contradiction"]) for p, h in hypotheses.items()
                         if "entailment" in h and "contradiction" in h)
    return path


def data_overrides(kind: str, data_dir: Path, work: Path) -> list[str]:
    if kind == "wiki":
        return ["--train_file", str(data_dir.parent / "wiki1m_subset.txt")]
    if kind == "triplets":
        return ["--train_file", str(snli_triplets(data_dir, work / "snli_triplets.csv"))]
    return []  # the recipe's own data, all in the data folder


def run_row(label: str, seeds: str, max_steps: int, data_dir: Path, output_dir: Path) -> dict | None:
    recipe, kind, _, _ = ROWS[label]
    if not (RECIPES / recipe).is_file():
        print(f"{label}: {recipe} does not exist; skipped", flush=True)
        return None
    folder = output_dir / recipe.removesuffix(".yaml")
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "hf_sentcl", "sweep", str(RECIPES / recipe), "--seeds", seeds,
               "--output_dir", str(folder), "--max_steps", str(max_steps), "--eval_before_training", "false",
               "--eval_tasks", "[sts]", "--export", "false", "--sts_data_dir", str(data_dir),
               *data_overrides(kind, data_dir, folder)]
    print(" ".join(command), flush=True)
    if subprocess.run(command).returncode != 0:
        print(f"{label}: the sweep failed; left out of the table", flush=True)
        return None
    summary = json.loads((folder / "seeds.json").read_text())
    steps = [json.loads((Path(run) / "results.json").read_text())["train"].get("train_step_seconds")
             for run in summary["runs"].values()]
    return {"avg": summary["after"]["Avg"], "step_seconds": [s for s in steps if s is not None],
            "recipe": recipe, "data": kind}


def table(rows: dict[str, dict], seeds: str, max_steps: int) -> str:
    lines = ["| method | MiniLM recipe | pooling | 7-STS avg, mean ± std | s / step | paper, BERT-base "
             "| paper's figure from |", "|---|---|---|---:|---:|---:|---|"]
    for label, row in rows.items():
        avg = row["avg"]
        spread = f" ± {avg['std']:.2f}" if avg["std"] is not None else ""
        step = sum(row["step_seconds"]) / len(row["step_seconds"]) if row["step_seconds"] else float("nan")
        paper, source = reported(label)
        pooling = yaml.safe_load((RECIPES / row["recipe"]).read_text()).get("pooling", "cls")
        lines.append(f"| {label} | `{row['recipe']}` | {pooling} | {avg['mean']:.2f}{spread} | {step:.2f} | "
                     f"{'-' if paper is None else f'{paper:.2f}'} | {source} |")
    lines += ["", f"Seeds {seeds}; {max_steps} optimizer steps per run; one process on this CPU; STS12-16 mode `all`. "
              "The paper's figure is BERT-base trained on its full data and budget: not comparable with the MiniLM "
              "rows, which start from an encoder already trained for sentence similarity: untouched, 78.88 with its "
              "own mean pooling and 73.69 with [CLS] (docs/methods/simcse.md), the baseline of the rows with each "
              "pooling."]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--max-steps", type=int, default=64)
    parser.add_argument("--methods", default=",".join(ROWS), help="labels of ROWS, comma-separated")
    parser.add_argument("--output-dir", default="outputs/method_table")
    parser.add_argument("--table", default=None, help="also write the Markdown table to this file")
    args = parser.parse_args()
    data_dir = Path(os.environ.get("HF_SENTCL_DATA", "")).expanduser()
    if not (data_dir / "STS").is_dir():
        parser.error("set HF_SENTCL_DATA to the SentEval folder (the Wikipedia subset is read beside it)")
    labels = [label.strip() for label in args.methods.split(",")]
    unknown = [label for label in labels if label not in ROWS]
    if unknown:
        parser.error(f"unknown --methods {unknown}; choose from {list(ROWS)}")
    rows = {}
    for label in labels:
        row = run_row(label, args.seeds, args.max_steps, data_dir, Path(args.output_dir))
        if row is not None:
            rows[label] = row
    text = table(rows, args.seeds, args.max_steps)
    print("\n" + text)
    if args.table:
        Path(args.table).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

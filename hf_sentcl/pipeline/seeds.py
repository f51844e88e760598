"""Run one recipe with several seeds and report the mean and standard deviation per task.

    hf-sentcl sweep RECIPE.yaml --seeds 1,2,3 [--key value ...]
    hf-sentcl sweep RECIPE.yaml --subset-sizes 10,100,1000 --seeds 1,2,3 [...]   # few-shot sweep

With `--subset-sizes` every (number of texts, seed) is a run: see `hf_sentcl.pipeline.fewshot`.

Each seed runs `hf_sentcl.pipeline.train.run` into `<output_dir>/seed-<N>` (same recipe and overrides, only `seed` and
`output_dir` differ). The untouched encoder's scores do not depend on the seed, so "before training" is evaluated
for the first seed only (unless the head is kept at inference, whose random initialisation does depend on it).
The summary goes to `<output_dir>/seeds.json` and `<output_dir>/seeds.md`; the standard deviation is the sample
one (ddof = 1), as papers reporting "mean ± std over seeds" (BYOP: 3 seeds, SG-BERT: 8) use.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from accelerate import PartialState

from hf_sentcl.evaluation.report import SHORT_NAMES
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.pipeline.train import run
from hf_sentcl.recipe.checks import validate_recipe
from hf_sentcl.recipe.parser import Recipe, RecipeError, parse_recipe
from hf_sentcl.recipe.run_folder import check_run_folder

USAGE = "usage: hf-sentcl sweep RECIPE.yaml --seeds 1,2,3 [--subset-sizes 10,100,...] [--key value ...]"

#: training figures summarised besides the STS tasks ("dev_*" are read at the best checkpoint's step)
TRAIN_KEYS = (
    "train_runtime",
    "train_examples_per_second",  # training steps alone, without dev evaluations and saves
    "train_peak_memory_mb",
    "best_dev_stsb_spearman",
    "dev_alignment",
    "dev_uniformity",
)


def parse_seeds(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; rejects empty, non-integer and repeated seeds."""
    try:
        seeds = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise RecipeError(f"--seeds expects comma-separated integers such as 1,2,3, got '{text}'.") from None
    if not seeds:
        raise RecipeError("--seeds is empty; give comma-separated integers such as 1,2,3.")
    if len(set(seeds)) != len(seeds):
        raise RecipeError(f"--seeds repeats a seed: '{text}'.")
    return seeds


def split_argv(argv: Sequence[str]) -> tuple[str, list[int], list[str]]:
    """RECIPE, --seeds and the remaining `--key value` overrides (passed through to the recipe parser)."""
    if not argv or argv[0].startswith("--"):
        raise RecipeError(f"the first argument must be the recipe file. {USAGE}")
    recipe, rest = argv[0], list(argv[1:])
    seeds_text = None
    for i, arg in enumerate(rest):
        if arg == "--seeds" and i + 1 < len(rest):
            seeds_text = rest[i + 1]
            del rest[i : i + 2]
            break
        if arg.startswith("--seeds="):
            seeds_text = arg.split("=", 1)[1]
            del rest[i]
            break
    if seeds_text is None:
        raise RecipeError(f"--seeds is missing. {USAGE}")
    if any(a == "--seed" or a.startswith("--seed=") for a in rest):
        raise RecipeError("--seed conflicts with --seeds; the runner sets the seed of each run.")
    return recipe, parse_seeds(seeds_text), rest


def seed_recipes(recipe_path: str, seeds: Sequence[int], overrides: Sequence[str]) -> dict[int, Recipe]:
    """Parse and validate the recipe once per seed (all before any training starts)."""
    base = parse_recipe(recipe_path, overrides)
    validate_recipe(base)
    root = Path(base.training.output_dir)
    recipes = {}
    for k, seed in enumerate(seeds):
        # the head is only random at evaluation time when kept at inference; otherwise "before" is seed-free
        before = base.data.eval_before_training and (k == 0 or base.model.head_at_inference)
        recipes[seed] = parse_recipe(
            recipe_path, overrides, seed=seed, output_dir=str(root / f"seed-{seed}"), eval_before_training=before
        )
        recipes[seed] = check_run_folder(recipes[seed])  # a rerun must not replace an earlier seed's run
        validate_recipe(recipes[seed])
    return recipes


def _stats(values: list[float]) -> dict[str, Any]:
    array = np.asarray(values, dtype=np.float64)
    std = float(array.std(ddof=1)) if len(array) > 1 else None
    return {"mean": float(array.mean()), "std": std, "values": [float(v) for v in array]}


def _best_dev_entry(train: dict[str, Any]) -> dict[str, Any]:
    curve = train.get("dev_curve") or []
    best = [e for e in curve if e.get("step") == train.get("best_step")]
    return best[-1] if best else (curve[-1] if curve else {})


def summarize(results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Mean/std per STS task (after training) and per training figure, from `run()` results keyed by seed."""
    seeds = list(results)
    first = results[seeds[0]]
    tasks = [t for t in (*STS_TASKS, "Avg") if all(t in r.get("sts", {}).get("after", {}) for r in results.values())]
    train_values: dict[str, list[float]] = {key: [] for key in TRAIN_KEYS}
    for r in results.values():
        train = r["train"]
        entry = _best_dev_entry(train)
        row = {**train, "dev_alignment": entry.get("eval_alignment"), "dev_uniformity": entry.get("eval_uniformity")}
        for key in TRAIN_KEYS:
            if row.get(key) is not None:
                train_values[key].append(row[key])
    before = next((r["sts"]["before"] for r in results.values() if "before" in r.get("sts", {})), None)
    return {
        "recipe": first.get("recipe"),
        "method": first.get("method"),
        "sts_mode": first.get("sts_mode"),
        "seeds": seeds,
        "std": "sample standard deviation (ddof=1) over seeds",
        "after": {t: _stats([r["sts"]["after"][t] for r in results.values()]) for t in tasks},
        "before": before,
        "train": {k: _stats(v) for k, v in train_values.items() if len(v) == len(seeds)},
    }


def _pm(stats: dict[str, Any], digits: int = 2) -> str:
    std = "–" if stats["std"] is None else f"{stats['std']:.{digits}f}"
    return f"{stats['mean']:.{digits}f} ± {std}"


def summary_markdown(summary: dict[str, Any]) -> str:
    """Per-seed STS rows, a mean ± std row, and a table of the training figures."""
    tasks = list(summary["after"])
    lines = ["| seed | " + " | ".join(SHORT_NAMES.get(t, t) for t in tasks) + " |", "|---|" + "---:|" * len(tasks)]
    if summary["before"]:
        lines.append("| before training | " + " | ".join(f"{summary['before'][t]:.2f}" for t in tasks) + " |")
    for k, seed in enumerate(summary["seeds"]):
        lines.append(f"| {seed} | " + " | ".join(f"{summary['after'][t]['values'][k]:.2f}" for t in tasks) + " |")
    lines.append("| **mean ± std** | " + " | ".join(_pm(summary["after"][t]) for t in tasks) + " |")
    lines += ["", f"Spearman x 100 after training; STS12-16 mode `{summary['sts_mode']}`; {summary['std']}.", ""]
    if summary["train"]:
        lines += ["| training figure | mean ± std |", "|---|---:|"]
        lines += [f"| {key} | {_pm(stats, 4 if key.startswith('dev_') else 2)} |"
                  for key, stats in summary["train"].items()]
        lines += ["", "dev_alignment / dev_uniformity: STS-B dev at the best checkpoint's step (lower is better)."]
    return "\n".join(lines)


def run_seeds(recipe_path: str, seeds: Sequence[int], overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Run the recipe once per seed and write `seeds.json` / `seeds.md` into the recipe's output_dir."""
    recipes = seed_recipes(recipe_path, seeds, overrides)
    results = {}
    for seed, recipe in recipes.items():
        print(f"\n=== seed {seed} -> {recipe.training.output_dir}", flush=True)
        results[seed] = run(recipe)
        gc.collect()
    summary = summarize(results) if PartialState().is_main_process else {}
    if summary:
        summary["overrides"] = list(overrides)
        summary["runs"] = {seed: r.training.output_dir for seed, r in recipes.items()}
        root = Path(next(iter(recipes.values())).training.output_dir).parent
        table = summary_markdown(summary)
        (root / "seeds.json").write_text(json.dumps(summary, indent=2) + "\n")
        (root / "seeds.md").write_text(table + "\n")
        print("\n" + table + f"\n\nSummary: {root / 'seeds.json'} and {root / 'seeds.md'}", flush=True)
    return summary

"""The few-shot sweep of ConSERT's section 5.3 (Figure 6), for any recipe: train on N texts drawn at random from the
training data, for every N and seed, and plot the 7-STS average against N.

    hf-sentcl sweep RECIPE.yaml --subset-sizes 1,10,100,1000,10000 --seeds 1,2,3 \
        [--full-results RUN/results.json] [--key value ...]

Run (N, seed) trains `hf_sentcl.pipeline.train.run` into `<output_dir>/size-<N>/seed-<seed>` with `train_subset_size: N`,
`train_subset_seed: seed` and `seed: seed` (the draw and the training both follow the seed), everything else as the
recipe and overrides say. Protocol choices (the paper gives none of them):

- **Steps**: the recipe's own (`max_steps` / epochs). With `max_steps` every N trains the same number of steps,
  cycling over its N texts, which is what the authors' code does with `--data_proportion` plus `--do_upsampling`
  (the subset repeated up to the full size). An epoch-based recipe would give N = 10 a single step per epoch: set
  `--max_steps` for a sweep.
- **Batch**: in-batch negatives need at least 2 texts per batch, and a batch cannot hold more distinct texts than
  N, so the per-device batch is min(batch, N).
- **N = 1** is skipped: the NT-Xent of two views of one text has no negative (the softmax has one term, the loss is
  0 and has no gradient), so training cannot change the model. The paper plots a value for 1 text without saying
  how it was trained; the table and plot leave that size out and say so.

Lines of the plot: the untouched model (the first run's before-training evaluation, or the `--full-results`
run's) and the full-data run (`--full-results` names an existing run's results.json; otherwise the recipe is
trained once more without a subset, with the first seed, into `<output_dir>/full`).
A rerun (after a crash, or with more sizes or seeds) reuses every run whose results.json was written with the same
training settings and checks every other output_dir before anything trains.
Writes `<output_dir>/fewshot.json`, `fewshot.md` and `fewshot.png`; standard deviations are sample ones (ddof=1).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from accelerate import PartialState

from hf_sentcl.data.corpus import load_training_dataset
from hf_sentcl.evaluation.plots import plot_fewshot_curve
from hf_sentcl.evaluation.report import SHORT_NAMES, write_json
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.methods import get_method
from hf_sentcl.pipeline.seeds import parse_seeds
from hf_sentcl.pipeline.train import run
from hf_sentcl.recipe.checks import checked, validate_recipe
from hf_sentcl.recipe.metadata import non_default_settings
from hf_sentcl.recipe.parser import Recipe, RecipeError, parse_recipe

USAGE = (
    "usage: hf-sentcl sweep RECIPE.yaml --subset-sizes 10,100,1000 --seeds 1,2,3 "
    "[--full-results RUN/results.json] [--key value ...]"
)


#: fewer texts than this leave in-batch contrastive losses without a negative
MIN_SUBSET_SIZE = 2


#: settings that change what a run reports but not the model it trains (a finished run is reused despite them)
EVALUATION_ONLY_SETTINGS = frozenset({"eval_before_training"})


SKIP_REASON = (
    "skipped: an in-batch contrastive loss over 2 views of 1 text has no negative (loss 0, no gradient); the paper "
    "does not say how it trained on 1 text"
)


def parse_sizes(text: str) -> list[int]:
    """'1,10,100' -> [1, 10, 100]; rejects empty, non-positive, non-integer and repeated sizes."""
    try:
        sizes = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        raise RecipeError(f"--subset-sizes expects comma-separated integers such as 10,100, got {text!r}.") from None
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise RecipeError(f"--subset-sizes needs distinct positive integers such as 10,100,1000, got '{text}'.")
    return sorted(sizes)


def _pop_option(args: list[str], name: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
            del args[i : i + 2]
            return value
        if arg.startswith(name + "="):
            del args[i]
            return arg.split("=", 1)[1]
    return None


def split_fewshot_argv(argv: Sequence[str]) -> tuple[str, list[int], list[int], str | None, list[str]]:
    """RECIPE, --subset-sizes, --seeds, --full-results and the remaining `--key value` recipe overrides."""
    if not argv or argv[0].startswith("--"):
        raise RecipeError(f"the first argument must be the recipe file. {USAGE}")
    rest = list(argv[1:])
    sizes, seeds = _pop_option(rest, "--subset-sizes"), _pop_option(rest, "--seeds")
    full = _pop_option(rest, "--full-results")
    if sizes is None or seeds is None:
        raise RecipeError(f"--subset-sizes and --seeds are both needed. {USAGE}")
    taken = [a for a in rest for key in ("--seed", "--train_subset_size", "--train_subset_seed")
             if a == key or a.startswith(key + "=")]
    if taken:
        raise RecipeError(f"{taken[0]} conflicts with the sweep, which sets the seed and the subset of each run.")
    if full is not None and not Path(full).is_file():
        raise RecipeError(f"--full-results '{full}' does not exist (a full-data run's results.json).")
    return argv[0], parse_sizes(sizes), parse_seeds(seeds), full, rest


def sweep_recipes(
    recipe_path: str, sizes: Sequence[int], seeds: Sequence[int], overrides: Sequence[str], run_full: bool
) -> dict[tuple[int, int], Recipe]:
    """Parse and validate every run of the sweep, keyed (N, seed) (N = 0: the full-data run), before any trains."""
    base = parse_recipe(recipe_path, overrides)
    validate_recipe(base)
    root = Path(base.training.output_dir)
    batch = base.training.per_device_train_batch_size
    recipes: dict[tuple[int, int], Recipe] = {}
    first = True
    for size in (s for s in sizes if s >= MIN_SUBSET_SIZE):
        for seed in seeds:
            recipes[size, seed] = parse_recipe(
                recipe_path, overrides, seed=seed, train_subset_size=size, train_subset_seed=seed,
                per_device_train_batch_size=min(batch, size), output_dir=str(root / f"size-{size}" / f"seed-{seed}"),
                eval_before_training=base.data.eval_before_training and first,
            )
            first = False
    if run_full:
        recipes[0, seeds[0]] = parse_recipe(
            recipe_path, overrides, seed=seeds[0], output_dir=str(root / "full"), eval_before_training=False
        )
    for key, recipe in recipes.items():
        validate_recipe(recipe)
        if finished_results(recipe) is None:
            recipes[key] = checked(recipe)  # an output_dir holding another or an unfinished run fails here
    check_sizes(base, sizes)
    return recipes


def _comparable_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in json.loads(json.dumps(settings)).items() if k not in EVALUATION_ONLY_SETTINGS}


def finished_results(recipe: Recipe) -> dict[str, Any] | None:
    """The results.json in the recipe's output_dir when that run finished with the same training settings, so that a
    rerun sweep (after a crash, or with more sizes or seeds) reuses it instead of training it again; else None."""
    path = Path(recipe.training.output_dir) / "results.json"
    if not path.is_file():
        return None
    try:
        results = json.loads(path.read_text())
    except ValueError:
        return None
    if _comparable_settings(results.get("recipe_settings", {})) != _comparable_settings(non_default_settings(recipe)):
        return None
    return results


def check_sizes(base: Recipe, sizes: Sequence[int]) -> None:
    """Raise RecipeError when the largest size exceeds the recipe's plain training text (read, no model loaded).
    A method's own training data (ConSERT's NLI pairs) is checked when its run loads it."""
    spec = get_method(base.method)
    if any(spec.train_data(stage) is not None for stage in spec.stages(base)):
        return
    available = len(load_training_dataset(base.data, spec.text_columns))
    if max(sizes) > available:
        raise RecipeError(
            f"--subset-sizes {max(sizes)} is larger than the recipe's training data ({available} texts); lower it."
        )


def _stats(values: list[float]) -> dict[str, Any]:
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if len(array) > 1 else None,
            "values": [float(v) for v in array]}


def summarize_sweep(
    results: dict[tuple[int, int], dict[str, Any]], skipped: Sequence[int], full: dict[str, Any] | None
) -> dict[str, Any]:
    """Mean/std per size and STS task from `run()` results keyed (N, seed); the untouched and full-data scores."""
    sizes = sorted({size for size, _ in results})
    tasks = [t for t in (*STS_TASKS, "Avg") if all(t in r["sts"].get("after", {}) for r in results.values())]
    before = next((r["sts"]["before"] for r in results.values() if "before" in r["sts"]), None)
    if before is None and full is not None:
        before = full["sts"].get("before")
    return {
        "sts_mode": next(iter(results.values())).get("sts_mode"),
        "std": "sample standard deviation (ddof=1) over seeds",
        "sizes": {
            str(size): {
                "seeds": [seed for n, seed in results if n == size],
                "examples": [results[n, seed]["training_data"]["examples"] for n, seed in results if n == size],
                **{task: _stats([results[n, s]["sts"]["after"][task] for n, s in results if n == size])
                   for task in tasks},
            }
            for size in sizes
        },
        "skipped": {str(size): SKIP_REASON for size in skipped},
        "before": before,
        "full": full["sts"]["after"] if full is not None else None,
        "full_examples": (full.get("training_data") or {}).get("examples") if full is not None else None,
    }


def _pm(stats: dict[str, Any]) -> str:
    return f"{stats['mean']:.2f} ± {'–' if stats['std'] is None else format(stats['std'], '.2f')}"


def sweep_markdown(summary: dict[str, Any]) -> str:
    """One row per number of texts (mean ± std over seeds), plus the untouched and full-data rows."""
    first = next(iter(summary["sizes"].values()))
    tasks = [t for t in (*STS_TASKS, "Avg") if t in first]
    lines = ["| texts | seeds | " + " | ".join(SHORT_NAMES.get(t, t) for t in tasks) + " |",
             "|---:|---:|" + "---:|" * len(tasks)]
    if summary["before"]:
        lines.append("| 0 (untouched) | – | " + " | ".join(f"{summary['before'][t]:.2f}" for t in tasks) + " |")
    for size, row in summary["sizes"].items():
        lines.append(f"| {int(size):,} | {len(row['seeds'])} | " + " | ".join(_pm(row[t]) for t in tasks) + " |")
    if summary["full"]:
        label = f"{summary['full_examples']:,} (full)" if summary["full_examples"] else "full"
        lines.append(f"| {label} | 1 | " + " | ".join(f"{summary['full'][t]:.2f}" for t in tasks) + " |")
    lines += ["", f"Spearman x 100 after training; STS12-16 mode `{summary['sts_mode']}`; {summary['std']}."]
    lines += [f"Size {size}: {reason}." for size, reason in summary["skipped"].items()]
    return "\n".join(lines)


def run_fewshot(
    recipe_path: str, sizes: Sequence[int], seeds: Sequence[int], overrides: Sequence[str] = (),
    full_results: str | None = None, recipes: dict[tuple[int, int], Recipe] | None = None,
) -> dict[str, Any]:
    """Run the sweep and write `fewshot.json`, `fewshot.md` and `fewshot.png` into the recipe's output_dir.
    `recipes`: the sweep's runs as `sweep_recipes` returned them, when the caller has already checked them."""
    if recipes is None:
        recipes = sweep_recipes(recipe_path, sizes, seeds, overrides, run_full=full_results is None)
    skipped = [s for s in sizes if s < MIN_SUBSET_SIZE]
    results: dict[tuple[int, int], dict[str, Any]] = {}
    for (size, seed), recipe in recipes.items():
        done = finished_results(recipe)
        state = "finished earlier, reused" if done is not None else "training"
        print(f"\n=== {size or 'all'} texts, seed {seed} -> {recipe.training.output_dir} ({state})", flush=True)
        results[size, seed] = done if done is not None else run(recipe, already_checked=True)
        gc.collect()
    if not PartialState().is_main_process:
        return {}
    full = json.loads(Path(full_results).read_text()) if full_results else results.pop((0, seeds[0]))
    summary = summarize_sweep(results, skipped, full)
    summary.update(recipe=recipe_path, overrides=list(overrides), full_results=full_results,
                   runs={f"{n}/{s}": r.training.output_dir for (n, s), r in recipes.items() if n})
    root = Path(parse_recipe(recipe_path, overrides).training.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    table = sweep_markdown(summary)
    write_json(root / "fewshot.json", summary)
    (root / "fewshot.md").write_text(table + "\n")
    points = {int(n): (row["Avg"]["mean"], row["Avg"]["std"] or 0.0) for n, row in summary["sizes"].items()}
    plot_fewshot_curve(
        points, root / "fewshot.png", before=(summary["before"] or {}).get("Avg"),
        full=(summary["full"] or {}).get("Avg"),
    )
    print("\n" + table + f"\n\nSweep: {root / 'fewshot.json'}, {root / 'fewshot.md'}, {root / 'fewshot.png'}",
          flush=True)
    return summary

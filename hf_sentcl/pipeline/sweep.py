"""Sweeps: one recipe run several times and summarised, over seeds or over training-set sizes x seeds.

    hf-sentcl sweep RECIPE.yaml --seeds 1,2,3 [--key value ...]
    hf-sentcl sweep RECIPE.yaml --subset-sizes 10,100,1000 --seeds 1,2,3 [--full-results RUN/results.json] [...]

Both sweeps build their runs the same way (`build_runs`: the recipe and overrides parsed once per run, with only
the run's own keys changed, every run checked before any trains) and run them the same way (`run_all`): a rerun
(after a crash, or with more seeds or sizes) reuses every run whose results.json was written with the same training
settings, and refuses any other output_dir that already holds a run. Standard deviations are sample ones (ddof=1,
`hf_sentcl.common.stats`), as papers reporting "mean ± std over seeds" (BYOP: 3 seeds, SG-BERT: 8) use.

**Seeds**: seed N runs `hf_sentcl.pipeline.train.run` into `<output_dir>/seed-<N>` (only `seed` and `output_dir`
differ). The untouched encoder's scores do not depend on the seed, so "before training" is evaluated for the first
seed only (unless the head is kept at inference, whose random initialisation does depend on it). Writes
`<output_dir>/seeds.json` and `seeds.md`.

**Few-shot** (ConSERT's section 5.3, Figure 6, for any recipe): run (N, seed) trains into
`<output_dir>/size-<N>/seed-<seed>` with `train_subset_size: N`, `train_subset_seed: seed` and `seed: seed` (the
draw and the training both follow the seed). Protocol choices (the paper gives none of them):

- **Steps**: the recipe's own (`max_steps` / epochs). With `max_steps` every N trains the same number of steps,
  cycling over its N texts, which is what the authors' code does with `--data_proportion` plus `--do_upsampling`
  (the subset repeated up to the full size). An epoch-based recipe would give N = 10 a single step per epoch: set
  `--max_steps` for a sweep.
- **Batch**: in-batch negatives need at least 2 texts per batch, and a batch cannot hold more distinct texts than
  N, so the per-device batch is min(batch, N).
- **N = 1** is skipped: the NT-Xent of two views of one text has no negative (the softmax has one term, the loss is
  0 and has no gradient), so training cannot change the model. The paper plots a value for 1 text without saying
  how it was trained; the table and plot leave that size out and say so.

Lines of the few-shot plot: the untouched model (the first run's before-training evaluation, or the
`--full-results` run's) and the full-data run (`--full-results` names an existing run's results.json; otherwise
the recipe is trained once more without a subset, with the first seed, into `<output_dir>/full`). Writes
`<output_dir>/fewshot.json`, `fewshot.md` and `fewshot.png`.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from accelerate import PartialState

from hf_sentcl.common.argv import has_option, parse_ints, pop_option
from hf_sentcl.common.layout import (
    FEWSHOT_JSON,
    FEWSHOT_MD,
    FEWSHOT_PNG,
    RUN_COMPLETE_JSON,
    SEEDS_JSON,
    SEEDS_MD,
    results_json,
)
from hf_sentcl.common.stats import SAMPLE_STD, mean_pm_std, seed_stats
from hf_sentcl.common.tables import markdown_table
from hf_sentcl.data.corpus import load_training_dataset
from hf_sentcl.evaluation.plots import plot_fewshot_curve
from hf_sentcl.evaluation.report import SHORT_NAMES, write_json
from hf_sentcl.evaluation.sts import STS_TASKS
from hf_sentcl.pipeline.train import run
from hf_sentcl.recipe.checks import checked, validate_recipe
from hf_sentcl.recipe.metadata import non_default_settings
from hf_sentcl.recipe.parser import Recipe, RecipeError, parse_recipe
from hf_sentcl.recipe.plan import RunPlan
from hf_sentcl.recipe.run_folder import RunComplete

#: the two sweeps' usage lines, in their errors and in `hf-sentcl sweep --help` (hf_sentcl/cli/sweep.py HELP)
USAGE = "usage: hf-sentcl sweep RECIPE.yaml --seeds 1,2,3 [--key value ...]"
FEWSHOT_USAGE = (
    "usage: hf-sentcl sweep RECIPE.yaml --subset-sizes 10,100,1000 --seeds 1,2,3 "
    "[--full-results RUN/results.json] [--key value ...]"
)

#: training figures summarised besides the STS tasks ("dev_*" are read at the best checkpoint's step)
TRAIN_KEYS = (
    "train_runtime",
    "train_examples_per_second",  # training steps alone, without dev evaluations and saves
    "train_peak_memory_mb",
    "best_dev_stsb_spearman",
    "dev_alignment",
    "dev_uniformity",
)

#: fewer texts than this leave in-batch contrastive losses without a negative
MIN_SUBSET_SIZE = 2

#: settings that change what a run reports but not the model it trains (a finished run is reused despite them)
EVALUATION_ONLY_SETTINGS = frozenset({"eval_before_training"})

SKIP_REASON = (
    "skipped: an in-batch contrastive loss over 2 views of 1 text has no negative (loss 0, no gradient); the paper "
    "does not say how it trained on 1 text"
)

Key = TypeVar("Key", bound=Hashable)


# ------------------------------------------------------------------------------------------------ arguments
def _ints(text: str, option: str) -> list[int]:
    try:
        return parse_ints(text, option)
    except ValueError as err:
        raise RecipeError(str(err)) from None


def parse_seeds(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; rejects empty, non-integer and repeated seeds."""
    seeds = _ints(text, "--seeds")
    if not seeds:
        raise RecipeError("--seeds is empty; give comma-separated integers such as 1,2,3.")
    if len(set(seeds)) != len(seeds):
        raise RecipeError(f"--seeds repeats a seed: '{text}'.")
    return seeds


def parse_sizes(text: str) -> list[int]:
    """'1,10,100' -> [1, 10, 100]; rejects empty, non-positive, non-integer and repeated sizes."""
    sizes = _ints(text, "--subset-sizes")
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise RecipeError(f"--subset-sizes needs distinct positive integers such as 10,100,1000, got '{text}'.")
    return sorted(sizes)


def _recipe_and_rest(argv: Sequence[str], usage: str) -> tuple[str, list[str]]:
    if not argv or argv[0].startswith("--"):
        raise RecipeError(f"the first argument must be the recipe file. {usage}")
    return argv[0], list(argv[1:])


def is_fewshot(argv: Sequence[str]) -> bool:
    """Whether the sweep's arguments ask for the few-shot sweep (`--subset-sizes`)."""
    return has_option(list(argv), "--subset-sizes")


def split_argv(argv: Sequence[str]) -> tuple[str, list[int], list[str]]:
    """RECIPE, --seeds and the remaining `--key value` overrides (passed through to the recipe parser)."""
    recipe, rest = _recipe_and_rest(argv, USAGE)
    seeds = pop_option(rest, "--seeds")
    if seeds is None:
        raise RecipeError(f"--seeds is missing. {USAGE}")
    if has_option(rest, "--seed"):
        raise RecipeError("--seed conflicts with --seeds; the runner sets the seed of each run.")
    return recipe, parse_seeds(seeds), rest


def split_fewshot_argv(argv: Sequence[str]) -> tuple[str, list[int], list[int], str | None, list[str]]:
    """RECIPE, --subset-sizes, --seeds, --full-results and the remaining `--key value` recipe overrides."""
    recipe, rest = _recipe_and_rest(argv, FEWSHOT_USAGE)
    sizes, seeds = pop_option(rest, "--subset-sizes"), pop_option(rest, "--seeds")
    full = pop_option(rest, "--full-results")
    if sizes is None or seeds is None:
        raise RecipeError(f"--subset-sizes and --seeds are both needed. {FEWSHOT_USAGE}")
    taken = [key for key in ("--seed", "--train_subset_size", "--train_subset_seed") if has_option(rest, key)]
    if taken:
        raise RecipeError(f"{taken[0]} conflicts with the sweep, which sets the seed and the subset of each run.")
    if full is not None:
        check_full_results(full)
    parsed = parse_sizes(sizes)
    if max(parsed) < MIN_SUBSET_SIZE:
        raise RecipeError(f"--subset-sizes '{sizes}': no size is at least {MIN_SUBSET_SIZE} ({SKIP_REASON}).")
    return recipe, parsed, parse_seeds(seeds), full, rest


def check_full_results(path: str) -> None:
    """RecipeError unless `path` is a run's results.json with its STS scores after training, which the summary's
    full-data row reads (checked before any run trains, not after all of them)."""
    what = "a full-data run's results.json, with sts.after"
    try:
        results = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise RecipeError(f"--full-results '{path}' does not exist ({what}).") from None
    except (OSError, ValueError) as err:
        raise RecipeError(f"--full-results '{path}' cannot be read as JSON ({err}); give {what}.") from None
    sts = results.get("sts") if isinstance(results, dict) else None
    if not isinstance(sts, dict) or not isinstance(sts.get("after"), dict) or not sts["after"]:
        raise RecipeError(f"--full-results '{path}' holds no STS scores after training; give {what} (not the "
                          "output of `hf-sentcl evaluate`).")


# ------------------------------------------------------------------------------------------------ runs
def _comparable_settings(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in json.loads(json.dumps(settings)).items() if k not in EVALUATION_ONLY_SETTINGS}


def finished_results(recipe: Recipe) -> dict[str, Any] | None:
    """The results.json in the recipe's output_dir when that run finished with the same training settings, so that a
    rerun sweep (after a crash, or with more sizes or seeds) reuses it instead of training it again; else None."""
    path = results_json(recipe.training.output_dir)
    if not path.is_file() or not (path.parent / RUN_COMPLETE_JSON).is_file():  # stopped before its export: resume
        return None
    try:
        results = json.loads(path.read_text())
    except ValueError:
        return None
    if _comparable_settings(results.get("recipe_settings", {})) != _comparable_settings(non_default_settings(recipe)):
        return None
    return results


def build_runs(
    recipe_path: str, overrides: Sequence[str], changes: Mapping[Key, Mapping[str, Any]]
) -> dict[Key, RunPlan]:
    """One recipe per run (the recipe and overrides, with the run's own `changes`), each validated and, unless it
    finished earlier with the same training settings, its output_dir checked: all before any run trains."""
    recipes = {}
    for key, change in changes.items():
        recipe = parse_recipe(recipe_path, overrides, **change)
        try:
            recipes[key] = validate_recipe(recipe) if finished_results(recipe) is not None else checked(recipe)
        except RunComplete:  # `resume_from_checkpoint: auto` into a finished run that finished_results did not take
            raise RecipeError(
                f"{recipe.source}: output_dir '{recipe.training.output_dir}' holds a finished run with other training "
                "settings than this sweep's; choose another output_dir or set 'overwrite_output_dir: true'."
            ) from None
    return recipes


def run_all(plans: Mapping[Key, RunPlan], describe: Mapping[Key, str]) -> dict[Key, dict[str, Any]]:
    """Each run's results: read back when it finished earlier with the same training settings, else trained."""
    results = {}
    for key, plan in plans.items():
        done = finished_results(plan.recipe)
        state = "finished earlier, reused" if done is not None else "training"
        print(f"\n=== {describe[key]} -> {plan.recipe.training.output_dir} ({state})", flush=True)
        results[key] = done if done is not None else run(plan)
        gc.collect()
    return results


def _base(recipe_path: str, overrides: Sequence[str]) -> RunPlan:
    return validate_recipe(parse_recipe(recipe_path, overrides))


# ------------------------------------------------------------------------------------------------ seeds
def seed_recipes(recipe_path: str, seeds: Sequence[int], overrides: Sequence[str]) -> dict[int, RunPlan]:
    """Parse and check the recipe once per seed (all before any training starts)."""
    base = _base(recipe_path, overrides).recipe
    root = Path(base.training.output_dir)
    # the head is only random at evaluation time when kept at inference; otherwise "before" is seed-free
    changes = {
        seed: {"seed": seed, "output_dir": str(root / f"seed-{seed}"),
               "eval_before_training": base.data.eval_before_training and (k == 0 or base.model.head_at_inference)}
        for k, seed in enumerate(seeds)
    }
    return build_runs(recipe_path, overrides, changes)


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
        "std": SAMPLE_STD,
        "after": {t: seed_stats([r["sts"]["after"][t] for r in results.values()]) for t in tasks},
        "before": before,
        "train": {k: seed_stats(v) for k, v in train_values.items() if len(v) == len(seeds)},
    }


def summary_markdown(summary: dict[str, Any]) -> str:
    """Per-seed STS rows, a mean ± std row, and a table of the training figures."""
    tasks, after = list(summary["after"]), summary["after"]
    rows = [["before training", *(f"{summary['before'][t]:.2f}" for t in tasks)]] if summary["before"] else []
    rows += [[seed, *(f"{after[t]['values'][k]:.2f}" for t in tasks)] for k, seed in enumerate(summary["seeds"])]
    rows.append(["**mean ± std**", *(mean_pm_std(after[t]) for t in tasks)])
    lines = markdown_table(["seed", *(SHORT_NAMES.get(t, t) for t in tasks)], rows)
    lines += ["", f"Spearman x 100 after training; STS12-16 mode `{summary['sts_mode']}`; {summary['std']}.", ""]
    if summary["train"]:
        figures = [[key, mean_pm_std(stats, 4 if key.startswith("dev_") else 2)]
                   for key, stats in summary["train"].items()]
        lines += markdown_table(["training figure", "mean ± std"], figures)
        lines += ["", "dev_alignment / dev_uniformity: STS-B dev at the best checkpoint's step (lower is better)."]
    return "\n".join(lines)


def run_seeds(
    recipe_path: str, seeds: Sequence[int], overrides: Sequence[str] = (), recipes: dict[int, RunPlan] | None = None
) -> dict[str, Any]:
    """Run (or reuse) the recipe once per seed and write `seeds.json` / `seeds.md` into the recipe's output_dir.
    `recipes`: the runs as `seed_recipes` returned them, when the caller has already checked them."""
    if recipes is None:
        recipes = seed_recipes(recipe_path, seeds, overrides)
    results = run_all(recipes, {seed: f"seed {seed}" for seed in recipes})
    if not PartialState().is_main_process:
        return {}
    summary = summarize(results)
    summary["overrides"] = list(overrides)
    summary["runs"] = {seed: r.recipe.training.output_dir for seed, r in recipes.items()}
    root = Path(parse_recipe(recipe_path, overrides).training.output_dir)
    table = summary_markdown(summary)
    write_json(root / SEEDS_JSON, summary)
    (root / SEEDS_MD).write_text(table + "\n")
    print("\n" + table + f"\n\nSummary: {root / SEEDS_JSON} and {root / SEEDS_MD}", flush=True)
    return summary


# ------------------------------------------------------------------------------------------------ few-shot
def sweep_recipes(
    recipe_path: str, sizes: Sequence[int], seeds: Sequence[int], overrides: Sequence[str], run_full: bool
) -> dict[tuple[int, int], RunPlan]:
    """Parse and check every run of the few-shot sweep, keyed (N, seed) (N = 0: the full-data run), before any
    trains."""
    base_plan = _base(recipe_path, overrides)
    base = base_plan.recipe
    root, batch = Path(base.training.output_dir), base.training.per_device_train_batch_size
    runs = [(size, seed) for size in sizes if size >= MIN_SUBSET_SIZE for seed in seeds]
    changes: dict[tuple[int, int], dict[str, Any]] = {
        (size, seed): {
            "seed": seed, "train_subset_size": size, "train_subset_seed": seed,
            "per_device_train_batch_size": min(batch, size), "output_dir": str(root / f"size-{size}" / f"seed-{seed}"),
            "eval_before_training": base.data.eval_before_training and k == 0,
        }
        for k, (size, seed) in enumerate(runs)
    }
    if run_full:
        changes[0, seeds[0]] = {"seed": seeds[0], "output_dir": str(root / "full"), "eval_before_training": False}
    recipes = build_runs(recipe_path, overrides, changes)
    check_sizes(base_plan, sizes)
    return recipes


def check_sizes(base: RunPlan, sizes: Sequence[int]) -> None:
    """Raise RecipeError when the largest size exceeds the recipe's plain training text (read, no model loaded).
    A method's own training data (ConSERT's NLI pairs) is checked when its run loads it."""
    if any(stage.train_data is not None for stage in base.stages):
        return
    available = len(load_training_dataset(base.recipe.data, base.method.text_columns))
    if max(sizes) > available:
        raise RecipeError(
            f"--subset-sizes {max(sizes)} is larger than the recipe's training data ({available} texts); lower it."
        )


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
        "std": SAMPLE_STD,
        "sizes": {
            str(size): {
                "seeds": [seed for n, seed in results if n == size],
                "examples": [results[n, seed]["training_data"]["examples"] for n, seed in results if n == size],
                **{task: seed_stats([results[n, s]["sts"]["after"][task] for n, s in results if n == size])
                   for task in tasks},
            }
            for size in sizes
        },
        "skipped": {str(size): SKIP_REASON for size in skipped},
        "before": before,
        "full": full["sts"]["after"] if full is not None else None,
        "full_examples": (full.get("training_data") or {}).get("examples") if full is not None else None,
    }


def sweep_markdown(summary: dict[str, Any]) -> str:
    """One row per number of texts (mean ± std over seeds), plus the untouched and full-data rows."""
    first = next(iter(summary["sizes"].values()))
    tasks = [t for t in (*STS_TASKS, "Avg") if t in first]
    rows = [["0 (untouched)", "–", *(f"{summary['before'][t]:.2f}" for t in tasks)]] if summary["before"] else []
    rows += [[f"{int(size):,}", len(row["seeds"]), *(mean_pm_std(row[t]) for t in tasks)]
             for size, row in summary["sizes"].items()]
    if summary["full"]:
        label = f"{summary['full_examples']:,} (full)" if summary["full_examples"] else "full"
        rows.append([label, 1, *(f"{summary['full'][t]:.2f}" for t in tasks)])
    lines = markdown_table(["texts", "seeds", *(SHORT_NAMES.get(t, t) for t in tasks)], rows, numeric_from=0)
    lines += ["", f"Spearman x 100 after training; STS12-16 mode `{summary['sts_mode']}`; {summary['std']}."]
    lines += [f"Size {size}: {reason}." for size, reason in summary["skipped"].items()]
    return "\n".join(lines)


def run_fewshot(
    recipe_path: str, sizes: Sequence[int], seeds: Sequence[int], overrides: Sequence[str] = (),
    full_results: str | None = None, recipes: dict[tuple[int, int], RunPlan] | None = None,
) -> dict[str, Any]:
    """Run (or reuse) every run of the few-shot sweep and write `fewshot.json`, `fewshot.md` and `fewshot.png` into
    the recipe's output_dir. `recipes`: the runs as `sweep_recipes` returned them, when the caller checked them."""
    if recipes is None:
        recipes = sweep_recipes(recipe_path, sizes, seeds, overrides, run_full=full_results is None)
    results = run_all(recipes, {(n, s): f"{n or 'all'} texts, seed {s}" for n, s in recipes})
    if not PartialState().is_main_process:
        return {}
    full = json.loads(Path(full_results).read_text()) if full_results else results.pop((0, seeds[0]))
    summary = summarize_sweep(results, [s for s in sizes if s < MIN_SUBSET_SIZE], full)
    summary.update(recipe=recipe_path, overrides=list(overrides), full_results=full_results,
                   runs={f"{n}/{s}": r.recipe.training.output_dir for (n, s), r in recipes.items() if n})
    root = Path(parse_recipe(recipe_path, overrides).training.output_dir)
    table = sweep_markdown(summary)
    write_json(root / FEWSHOT_JSON, summary)
    (root / FEWSHOT_MD).write_text(table + "\n")
    points = {int(n): (row["Avg"]["mean"], row["Avg"]["std"] or 0.0) for n, row in summary["sizes"].items()}
    plot_fewshot_curve(points, root / FEWSHOT_PNG, before=(summary["before"] or {}).get("Avg"),
                       full=(summary["full"] or {}).get("Avg"))
    print("\n" + table + f"\n\nSweep: {root / FEWSHOT_JSON}, {root / FEWSHOT_MD}, {root / FEWSHOT_PNG}", flush=True)
    return summary

"""`hf-sentcl sweep RECIPE --seeds 1,2,3 [--subset-sizes ...]`: several runs of one recipe, summarised."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from functools import partial

from hf_sentcl.cli.train import watched_run
from hf_sentcl.common import exits
from hf_sentcl.common.logs import setup_logging
from hf_sentcl.pipeline import sweep
from hf_sentcl.recipe.parser import Recipe, RecipeError
from hf_sentcl.recipe.run_folder import recorded_failures


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(sweep.USAGE)
        return 0 if argv else 2
    setup_logging()
    try:  # every run is parsed and checked here, before any trains
        if sweep.is_fewshot(argv):
            recipe, sizes, seeds, full, overrides = sweep.split_fewshot_argv(argv)
            runs = sweep.sweep_recipes(recipe, sizes, seeds, overrides, run_full=full is None)
            start = partial(sweep.run_fewshot, recipe, sizes, seeds, overrides, full, recipes=runs)
        else:
            recipe, seeds, overrides = sweep.split_argv(argv)
            seed_runs = sweep.seed_recipes(recipe, seeds, overrides)
            start = partial(sweep.run_seeds, recipe, seeds, overrides, recipes=seed_runs)
    except (RecipeError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return exits.BAD_INPUT
    recipes = runs if sweep.is_fewshot(argv) else seed_runs
    signals = next(iter(recipes.values())).training.preemption_signals

    def work() -> int:
        start()
        return publishing_status(recipes.values())

    return watched_run(work, signals)  # preempted: the same command resumes the sweep (finished runs are reused)


def publishing_status(recipes: Iterable[Recipe]) -> int:
    """FAILED when any run's export or push failed, this time or in an earlier sweep whose run is reused (each run
    printed its error as it ended; they are listed again here, where a sweep's long log ends), else OK. The summary
    is written either way: the scores do not depend on the export."""
    failed = {r.training.output_dir: f for r in recipes if (f := recorded_failures(r.training.output_dir))}
    for output_dir, failures in failed.items():
        print(f"error: run {output_dir}: " + " ".join(failures.values()), file=sys.stderr, flush=True)
    return exits.FAILED if failed else exits.OK

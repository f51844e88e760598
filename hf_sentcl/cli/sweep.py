"""`hf-sentcl sweep RECIPE --seeds 1,2,3 [--subset-sizes ...]`: several runs of one recipe, summarised."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from functools import partial

from hf_sentcl.cli.train import watched_run
from hf_sentcl.common import exits
from hf_sentcl.common.logs import setup_logging
from hf_sentcl.pipeline import sweep
from hf_sentcl.recipe.parser import RecipeError


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
    signals = next(iter((runs if sweep.is_fewshot(argv) else seed_runs).values())).training.preemption_signals

    def work() -> int:
        start()
        return exits.OK

    return watched_run(work, signals)  # preempted: the same command resumes the sweep (finished runs are reused)

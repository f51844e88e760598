"""`hf-sentcl sweep RECIPE --seeds 1,2,3 [--subset-sizes ...]`: several runs of one recipe, summarised.

The help is answered before anything heavy is imported (the sweep imports the training pipeline, hence torch)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from functools import partial
from typing import TYPE_CHECKING

from hf_sentcl.common import exits

if TYPE_CHECKING:
    from hf_sentcl.recipe.plan import RunPlan

PROG = "hf-sentcl sweep"

HELP_FLAGS = ("-h", "--help")

#: the sweeps' options (`hf_sentcl.pipeline.sweep.split_argv` / `split_fewshot_argv`) and what they write; the two
#: usage lines are the ones the sweep's errors print (pipeline/sweep.py USAGE and FEWSHOT_USAGE, checked by a test)
HELP = """\
usage: {prog} RECIPE.yaml --seeds 1,2,3 [--key value ...]
       {prog} RECIPE.yaml --subset-sizes 10,100,1000 --seeds 1,2,3 [--full-results RUN/results.json] [--key value ...]

Train one recipe several times and summarise the STS scores as mean ± sample std (ddof=1) over seeds, as papers
report "mean ± std over seeds". Every run is parsed and checked before any trains; a rerun (after a crash, or with
more seeds or sizes) reuses each run whose results.json was written with the same training settings.

Seed sweep (--seeds without --subset-sizes):
  seed N trains into <output_dir>/seed-<N> (only `seed` and `output_dir` differ); writes <output_dir>/seeds.json
  and seeds.md. "Before training" is evaluated for the first seed only (it does not depend on the seed).

Few-shot sweep (--subset-sizes; ConSERT's section 5.3, for any recipe):
  run (N, S) trains on N texts drawn with seed S into <output_dir>/size-<N>/seed-<S>, with the recipe's own steps
  (set --max_steps: an epoch of 10 texts is one step) and a per-device batch of min(batch, N). Size 1 is skipped
  (one text has no in-batch negative). Writes <output_dir>/fewshot.json, fewshot.md and fewshot.png.

options:
  RECIPE.yaml                  the recipe to sweep (first argument)
  --seeds 1,2,3                comma-separated distinct integer seeds (required); each run's `seed`
  --subset-sizes 10,100,1000   distinct positive numbers of training texts: the few-shot sweep
  --full-results RUN/results.json
                               few-shot only: an existing full-data run's results.json (with STS scores after
                               training) for the plot's full-data line; without it the recipe is also trained once
                               on all its data, with the first seed, into <output_dir>/full
  --key value                  any recipe key, for every run (as in `hf-sentcl train`), except those the sweep
                               sets per run: --seed, and (few-shot) --train_subset_size and --train_subset_seed
  -h, --help                   this help

Options take `--name value` or `--name=value`. Exit status: 0 when every run trained, exported and (if asked)
pushed; 1 when a run's export or push failed (the summary is written anyway); 2 for a bad recipe or option, before
any run trains; 75 when preempted (rerun the same command to resume).

examples:
  {prog} recipes/simcse_bert.yaml --seeds 1,2,3
  {prog} recipes/simcse_bert.yaml --seeds 1,2,3 --perturbation p+n- --margin 0.05 --output_dir runs/byop
  {prog} recipes/consert_bert.yaml --subset-sizes 10,100,1000 --seeds 1,2,3 --max_steps 200
  {prog} recipes/consert_bert.yaml --subset-sizes 10,100 --seeds 1,2 --full-results runs/consert/results.json
"""


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run the sweep `argv` asks for (or print its help); the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if set(HELP_FLAGS) & set(argv):
        print(HELP.format(prog=prog), end="")
        return 0
    if not argv:
        print(HELP.format(prog=prog).split("\n\n")[0] + f"\n\n`{prog} --help` for the options.")
        return 2
    return run_sweep(argv)


def run_sweep(argv: list[str]) -> int:
    """Parse and check every run, then train them with the preemption signals watched; the exit status."""
    from hf_sentcl.cli.train import watched_run
    from hf_sentcl.common.logs import setup_logging
    from hf_sentcl.pipeline import sweep
    from hf_sentcl.recipe.parser import RecipeError

    setup_logging()
    try:  # every run is parsed and checked here, before any trains
        if sweep.is_fewshot(argv):
            recipe, sizes, seeds, full, overrides = sweep.split_fewshot_argv(argv)
            recipes = sweep.sweep_recipes(recipe, sizes, seeds, overrides, run_full=full is None)
            start = partial(sweep.run_fewshot, recipe, sizes, seeds, overrides, full, recipes=recipes)
        else:
            recipe, seeds, overrides = sweep.split_argv(argv)
            recipes = sweep.seed_recipes(recipe, seeds, overrides)
            start = partial(sweep.run_seeds, recipe, seeds, overrides, recipes=recipes)
    except (RecipeError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return exits.BAD_INPUT
    signals = next(iter(recipes.values())).recipe.training.preemption_signals

    def work() -> int:
        start()
        return publishing_status(recipes.values())

    return watched_run(work, signals)  # preempted: the same command resumes the sweep (finished runs are reused)


def publishing_status(plans: Iterable[RunPlan]) -> int:
    """FAILED when any run's export or push failed, this time or in an earlier sweep whose run is reused (each run
    printed its error as it ended; they are listed again here, where a sweep's long log ends), else OK. The summary
    is written either way: the scores do not depend on the export."""
    from hf_sentcl.recipe.run_folder import recorded_failures

    output_dirs = [plan.recipe.training.output_dir for plan in plans]
    failed = {out: f for out in output_dirs if (f := recorded_failures(out))}
    for output_dir, failures in failed.items():
        print(f"error: run {output_dir}: " + " ".join(failures.values()), file=sys.stderr, flush=True)
    return exits.FAILED if failed else exits.OK

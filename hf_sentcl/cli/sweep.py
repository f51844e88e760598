"""`hf-sentcl sweep RECIPE --seeds 1,2,3 [--subset-sizes ...]`: several runs of one recipe, summarised."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from hf_sentcl.common.logs import setup_logging
from hf_sentcl.pipeline.seeds import USAGE, run_seeds, seed_recipes, split_argv
from hf_sentcl.recipe.parser import RecipeError


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    setup_logging()
    if any(a == "--subset-sizes" or a.startswith("--subset-sizes=") for a in argv):
        from hf_sentcl.pipeline import fewshot

        try:
            recipe, sizes, seeds, full, overrides = fewshot.split_fewshot_argv(argv)
            recipes = fewshot.sweep_recipes(recipe, sizes, seeds, overrides, run_full=full is None)
        except (RecipeError, FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        fewshot.run_fewshot(recipe, sizes, seeds, overrides, full, recipes=recipes)
        return 0
    try:
        recipe, seeds, overrides = split_argv(argv)
        seed_recipes(recipe, seeds, overrides)
    except (RecipeError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    run_seeds(recipe, seeds, overrides)
    return 0

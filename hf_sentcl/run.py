"""`python -m hf_sentcl.run RECIPE [--key value ...]` and `accelerate launch -m hf_sentcl.run RECIPE`: train as a
recipe says. The same command as `hf-sentcl train` (hf_sentcl.cli.train), kept under the name users launch."""

import sys

from hf_sentcl.common.preemption import watch_early

watch_early()  # a scheduler's signal during the seconds of imports below is noted, not fatal

if __name__ == "__main__" and (not sys.argv[1:] or {"-h", "--help"} & set(sys.argv[1:])):
    from hf_sentcl.cli import HELP_FLAGS, print_recipe_help  # the help answers without importing torch
    from hf_sentcl.recipe.parser import RUN_PROG

    status = print_recipe_help([a for a in sys.argv[1:] if a not in HELP_FLAGS], RUN_PROG)
    sys.exit(status if sys.argv[1:] else 2)

from hf_sentcl.cli.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

"""The command line: `hf-sentcl COMMAND [...]` (also `python -m hf_sentcl COMMAND`), one thin module per command.

Each command module has `main(argv) -> exit status` (and `main(argv, prog)` where its help names the program) and
parses its own arguments; this module only dispatches, importing a command when it runs, so `hf-sentcl --help` and
`--version` answer without loading torch. `hf-sentcl train --help` is answered here too (`print_recipe_help`): the
train module imports the training pipeline, and its help needs the recipe parser only.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Sequence

#: command -> (module, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("hf_sentcl.cli.train", "train and evaluate as a recipe says (also `python -m hf_sentcl.run RECIPE`)"),
    "evaluate": ("hf_sentcl.cli.evaluate", "STS, transfer and GLUE suites of an encoder or backbone"),
    "export": ("hf_sentcl.cli.export", "a saved encoder as a plain Hugging Face model, checked, with its card"),
    "push": ("hf_sentcl.cli.push", "upload an export folder to the Hub"),
    "sweep": ("hf_sentcl.cli.sweep", "one recipe over several seeds (and training-set sizes), summarised"),
    "glue": ("hf_sentcl.cli.glue", "GLUE fine-tuning of an encoder's backbone"),
    "analyze": ("hf_sentcl.cli.analyze", "layer x pooling study of an encoder (SG-BERT's Figure 1)"),
    "data": ("hf_sentcl.cli.data", "prefetch the Hub data, or show where each data source is read from"),
    "mine": ("hf_sentcl.cli.mine", "hard negatives for (anchor, positive) pairs: the sent0,sent1,hard_neg csv"),
}


#: the commands that train, and so take preemption signals from their first line
TRAINING_COMMANDS = ("train", "sweep")


def get_commands() -> dict[str, str]:
    """Command name -> one-line summary, in the order `--help` lists them."""
    return {name: summary for name, (_, summary) in COMMANDS.items()}


#: the program name when installed (the console script); `python -m hf_sentcl` passes its own
PROG = "hf-sentcl"

HELP_FLAGS = ("-h", "--help")


def usage(prog: str = PROG) -> str:
    """The top-level help: the commands with their one-line summaries."""
    width = max(map(len, COMMANDS))
    lines = [f"  {name:{width}}  {summary}" for name, summary in get_commands().items()]
    return (
        f"usage: {prog} COMMAND [ARGS ...]   (`{prog} COMMAND --help` for its options; `{prog} --version`)\n\n"
        "commands:\n" + "\n".join(lines)
    )


#: the distribution pip installs (pyproject.toml's `name`), whose metadata holds the version
DISTRIBUTION = "hf-sentcl"


def version() -> str:
    """`hf-sentcl <version>`, from the installed package's metadata (pyproject.toml's version, which
    `hf_sentcl.__version__` repeats: a test checks they agree; this layer may not import the package's top)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return f"{PROG} {installed_version(DISTRIBUTION)}"
    except PackageNotFoundError:  # a source tree that pip never installed
        return f"{PROG} (version unknown: the {DISTRIBUTION} package is not installed; `pip install -e .`)"


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """Run `prog COMMAND [ARGS ...]` (argv without the program name); the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in HELP_FLAGS:
        print(usage(prog))
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(version())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        print(f"error: unknown command '{name}'.{hint}\n\n{usage(prog)}", file=sys.stderr)
        return 2
    wants_help = bool(set(HELP_FLAGS) & set(rest))
    if name == "train" and (wants_help or not rest):  # without importing the training pipeline (and torch)
        status = print_recipe_help([a for a in rest if a not in HELP_FLAGS], f"{prog} {name}")
        return status if rest else 2
    if name in TRAINING_COMMANDS and not wants_help:
        from hf_sentcl.common.preemption import watch_early

        watch_early()  # a scheduler's signal during the seconds of imports below is noted, not fatal
    module = importlib.import_module(COMMANDS[name][0])
    if "prog" in inspect.signature(module.main).parameters:  # its help names the program as it was called
        return module.main(rest, prog=f"{prog} {name}")
    return module.main(rest)


def print_recipe_help(argv: list[str], prog: str) -> int:
    """Print the help of `prog [RECIPE] [--method NAME] [--key value ...]` (`hf-sentcl train`,
    `python -m hf_sentcl.run`; help flags removed from `argv`): the usage and the methods, or a method's keys
    (`hf_sentcl.recipe.parser.recipe_help`); the exit status, 2 with one `error:` line for an unknown method or an
    unreadable recipe."""
    from hf_sentcl.recipe.parser import RecipeError, recipe_help

    try:
        print(recipe_help(argv, prog))
    except (RecipeError, KeyError) as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    return 0

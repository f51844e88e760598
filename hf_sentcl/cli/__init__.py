"""The command line: `hf-sentcl COMMAND [...]` (also `python -m hf_sentcl COMMAND`), one thin module per command.

Each command module has `main(argv) -> exit status` and parses its own arguments; this module only dispatches,
importing a command when it runs, so `hf-sentcl --help` answers without loading torch.
"""

from __future__ import annotations

import difflib
import importlib
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


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:{width}}  {summary}" for name, summary in get_commands().items()]
    return (
        "usage: hf-sentcl COMMAND [ARGS ...]   (`hf-sentcl COMMAND --help` for its options)\n\ncommands:\n"
        + "\n".join(lines)
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        print(f"error: unknown command '{name}'.{hint}\n\n{usage()}", file=sys.stderr)
        return 2
    if name in TRAINING_COMMANDS and not {"-h", "--help"} & set(rest):
        from hf_sentcl.common.preemption import watch_early

        watch_early()  # a scheduler's signal during the seconds of imports below is noted, not fatal
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(rest)

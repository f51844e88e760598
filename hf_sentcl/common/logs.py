"""Log lines, and progress bars only where someone watches them: a terminal on stderr.

Bars redrawn into a log file or CI output leave carriage returns and cursor-up (`[A`) fragments between the lines
that matter, so every command line turns the libraries' bars off when stderr is not a terminal.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

#: seconds after which `hang_dump` prints every thread's stack and ends the process (unset: never)
HANG_DUMP_ENV = "HF_SENTCL_HANG_DUMP_S"


def watched() -> bool:
    """Whether stderr is a terminal, where progress bars are worth drawing."""
    return sys.stderr.isatty()


def quiet_library_bars() -> None:
    """Without a terminal on stderr: no `datasets` bars (map, tokenising) and no transformers bars (weight loading
    and saving, huggingface_hub downloads)."""
    if watched():
        return
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def setup_logging() -> None:
    """What every command line logs: INFO lines with time and logger name, only warnings from `datasets` and
    `transformers`, and no library progress bars without a terminal (`quiet_library_bars`)."""
    import datasets
    import transformers

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    datasets.utils.logging.set_verbosity_warning()
    transformers.utils.logging.set_verbosity_warning()
    quiet_library_bars()


@contextmanager
def hang_dump() -> Iterator[float | None]:
    """Opt-in diagnosis of a run that hangs or crawls: with `HF_SENTCL_HANG_DUMP_S=N` in the environment, every
    thread's Python stack is written to stderr if the block still runs N seconds after it began, and the process
    exits with status 1 (`faulthandler.dump_traceback_later`; PYTHONFAULTHANDLER has no timeout). Leaving the block
    disarms it (the interpreter's own shutdown, seconds after a big run, is not the run). Yields N, or None when
    unset."""
    value = os.environ.get(HANG_DUMP_ENV, "").strip()
    if not value:
        yield None
        return
    import faulthandler

    try:
        seconds = float(value)
    except ValueError:
        raise SystemExit(f"{HANG_DUMP_ENV}={value!r}: give a number of seconds, e.g. {HANG_DUMP_ENV}=600.") from None
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield seconds
    finally:
        faulthandler.cancel_dump_traceback_later()

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
#: what opens the dump in the log (faulthandler's own fallback opens with "Timeout (")
HANG_DUMP_HEADER = f"{HANG_DUMP_ENV}: still running after"
#: how much later faulthandler's own timer dumps and exits, for a hang that holds the GIL
HANG_DUMP_GIL_GRACE_S = 60.0


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
    exits with status 1 (PYTHONFAULTHANDLER has no timeout). Leaving the block disarms it (the interpreter's own
    shutdown, seconds after a big run, is not the run). Yields N, or None when unset.

    The dump comes from a watchdog thread that holds the GIL while it reads the other threads' frames, so they stand
    still. `faulthandler.dump_traceback_later` reads them without the GIL, and a thread that is busy (importing, say)
    can free a frame under it: CI saw that end in a segmentation fault instead of exit 1. It is kept only as the
    fallback, `HANG_DUMP_GIL_GRACE_S` later, for a hang inside C code that never releases the GIL (collectives and
    sleeps release it)."""
    value = os.environ.get(HANG_DUMP_ENV, "").strip()
    if not value:
        yield None
        return
    import faulthandler
    import threading

    try:
        seconds = float(value)
    except ValueError:
        raise SystemExit(f"{HANG_DUMP_ENV}={value!r}: give a number of seconds, e.g. {HANG_DUMP_ENV}=600.") from None
    if not seconds > 0:
        raise SystemExit(f"{HANG_DUMP_ENV}={value!r}: give a positive number of seconds, e.g. {HANG_DUMP_ENV}=600.")
    finished = threading.Event()

    def dump_if_still_running() -> None:
        if finished.wait(seconds):
            return
        sys.stderr.write(f"{HANG_DUMP_HEADER} {seconds:g} s; every thread's stack follows and the process ends "
                         "with status 1.\n")
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        os._exit(1)

    threading.Thread(target=dump_if_still_running, name="hf_sentcl-hang-dump", daemon=True).start()
    faulthandler.dump_traceback_later(seconds + HANG_DUMP_GIL_GRACE_S, exit=True)
    try:
        yield seconds
    finally:
        finished.set()
        faulthandler.cancel_dump_traceback_later()

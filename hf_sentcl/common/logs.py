"""Log lines, and progress bars only where someone watches them: a terminal on stderr.

Bars redrawn into a log file or CI output leave carriage returns and cursor-up (`[A`) fragments between the lines
that matter, so every command line turns the libraries' bars off when stderr is not a terminal.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

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


#: how every command line's log lines look
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: libraries whose INFO lines name nothing the user asked about: sentence-transformers' "Saving model to
#: .../.export.partial-xxx" and "Loading SentenceTransformer model from ..." (the export's check), and the HTTP
#: client's "HTTP Request: POST ..." for every request of a push (huggingface_hub uses httpx; `httpx2`/`httpcore2`
#: where that fork is installed). Their warnings still show.
WARNINGS_ONLY = ("sentence_transformers", "httpx", "httpcore", "httpx2", "httpcore2")

#: (logger, text of the message) of records shown once at DEBUG instead of as warnings: the note that MTEB result
#: files are filed under mteb's `no_revision_available` (hf_sentcl.export.mteb_files.UNPUSHED_NOTE), which every
#: run's export logs when mteb is installed, although nothing asked for MTEB files (docs/export.md says what to do)
DEMOTED = (("hf_sentcl", "revision 'no_revision_available': MTEB's results repository will not take"),)

#: DeepSpeed's warning when it finds no accelerator (deepspeed/accelerator/real_accelerator.py); accelerate imports
#: deepspeed in every Trainer when it is installed (`Accelerator.unwrap_model`)
DEEPSPEED_CPU_FALLBACK = "Setting accelerator to CPU"


class DemotedRecords(logging.Filter):
    """For a console handler: the records `DEMOTED` names become DEBUG records, shown once, and only when their
    logger is enabled for DEBUG; every other record passes unchanged."""

    def __init__(self, demoted: tuple[tuple[str, str], ...] = DEMOTED) -> None:
        super().__init__()
        self.demoted = demoted
        self.shown: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not any(record.name == name and text in record.getMessage() for name, text in self.demoted):
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        message = record.getMessage()
        if message in self.shown or not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        self.shown.add(message)
        return True


class NoCpuFallbackWarning(logging.Filter):
    """For DeepSpeed's logger: drop its "Setting accelerator to CPU" warning when torch sees no CUDA device either,
    i.e. on a machine without a GPU, where the run is on CPU anyway and says so. On a machine whose GPU torch sees
    but DeepSpeed did not detect, the warning is kept: that is worth knowing."""

    def filter(self, record: logging.LogRecord) -> bool:
        if DEEPSPEED_CPU_FALLBACK not in record.getMessage():
            return True
        import torch  # loaded already: DeepSpeed imports it

        return torch.cuda.is_available()


def setup_logging() -> None:
    """What every command line logs: INFO lines with time and logger name, only warnings from `datasets`,
    `transformers` and the `WARNINGS_ONLY` libraries, no library progress bars without a terminal
    (`quiet_library_bars`), and none of the notes that name nothing the user asked about (`quiet_library_notes`).

    The console handler is installed, as `logging.basicConfig` does, only when the root logger has none: a program
    that configured logging itself keeps its own handlers."""
    import datasets
    import transformers

    root = logging.getLogger()
    if not root.handlers:
        console = logging.StreamHandler()
        console.setFormatter(logging.Formatter(LOG_FORMAT))
        console.addFilter(DemotedRecords())
        root.addHandler(console)
        root.setLevel(logging.INFO)
    datasets.utils.logging.set_verbosity_warning()
    transformers.utils.logging.set_verbosity_warning()
    quiet_library_notes()
    quiet_library_bars()


def quiet_library_notes() -> None:
    """The `WARNINGS_ONLY` libraries' loggers at WARNING, and DeepSpeed's CPU fallback warning dropped on a machine
    without a GPU (`NoCpuFallbackWarning`; a filter, because DeepSpeed sets its logger's level when it loads).
    Neither imports the library."""
    for name in WARNINGS_ONLY:
        logging.getLogger(name).setLevel(logging.WARNING)
    deepspeed = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, NoCpuFallbackWarning) for f in deepspeed.filters):
        deepspeed.addFilter(NoCpuFallbackWarning())


def trainer_log_line(logs: Mapping[str, Any]) -> str:
    """Trainer's logs as one printed line of numbers, `{'loss': 1.327, 'grad_norm': 8.858, 'learning_rate': 0.001,
    'epoch': 0.5}`: floats to 4 significant digits, as transformers' PrinterCallback rounds them, but kept numbers
    (transformers 5 formats them into strings, which its printed dict quotes: `'loss': '1.327'`); `total_flos`
    left out, as PrinterCallback does."""
    return str({key: float(f"{value:.4g}") if isinstance(value, float) else value
                for key, value in logs.items() if key != "total_flos"})


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

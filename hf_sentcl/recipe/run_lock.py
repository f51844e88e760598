"""One run at a time in an output_dir: the processes that write a run's files hold an advisory lock (flock) on the
output_dir folder itself for as long as they live, and name themselves in `output_dir/.hf_sentcl.lock`.

A requeued job can start while a process of the job before it still writes into the same folder (a worker orphaned
by a launcher that died, a node the scheduler has not cleaned up yet). Two writers would resolve, rotate and remove
each other's checkpoints. The new run therefore waits for the lock, up to `HF_SENTCL_OUTPUT_DIR_WAIT_S` seconds
(default 120: time for the old process to finish its checkpoint and exit), and then refuses, naming the process that
holds it. The lock goes with the process (the kernel drops it when the process ends, however it ends), so a killed
run never leaves a stale one. A run refused by its checks leaves the folder as it found it (the name file is written
only once the checks passed). Where the file system has no flock for folders (some network file systems), runs go
unlocked, as before.
"""

from __future__ import annotations

import datetime
import fcntl
import logging
import os
import socket
import time
from pathlib import Path

from hf_sentcl.recipe.parser import Recipe, RecipeError

logger = logging.getLogger("hf_sentcl")

LOCK_NAME = ".hf_sentcl.lock"
WAIT_ENV = "HF_SENTCL_OUTPUT_DIR_WAIT_S"
DEFAULT_WAIT_S = 120.0
#: output_dir -> the open lock file of this process (kept open: closing it would drop the lock)
_held: dict[Path, int] = {}


def lock_wait_seconds() -> float:
    """`HF_SENTCL_OUTPUT_DIR_WAIT_S`, checked (RecipeError naming the variable)."""
    text = os.environ.get(WAIT_ENV, "").strip()
    try:
        value = float(text) if text else DEFAULT_WAIT_S
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise RecipeError(f"{WAIT_ENV}='{text}' is not a number of seconds >= 0 (how long a run waits for another "
                          f"run that still writes into its output_dir; default {DEFAULT_WAIT_S:g}).")
    return value


def hold_output_dir(recipe: Recipe, checked: bool = False) -> None:
    """Take the output_dir lock for this process's lifetime (processes that save the run's files only; nothing when
    output_dir does not exist yet, or on a file system without folder locks). Waits for a run that holds it;
    RecipeError when it still does after the wait. `checked`: the run folder checks passed, so this process names
    itself in the folder as the holder."""
    if not recipe.training.should_save or not recipe.training.output_dir:
        return
    output_dir = Path(recipe.training.output_dir).expanduser().resolve()
    if output_dir not in _held and output_dir.is_dir():
        try:
            descriptor = os.open(output_dir, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            if not wait_for_lock(descriptor, output_dir, recipe.source):
                os.close(descriptor)
                return
        except BaseException:
            os.close(descriptor)
            raise
        _held[output_dir] = descriptor
    if checked and output_dir in _held:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        try:
            (output_dir / LOCK_NAME).write_text(f"pid {os.getpid()} on {socket.gethostname()} since {now}\n")
        except OSError:
            pass


def holder(output_dir: Path) -> str:
    try:
        return (output_dir / LOCK_NAME).read_text().strip() or "another process"
    except OSError:
        return "another process"


def wait_for_lock(descriptor: int, output_dir: Path, source: str) -> bool:
    """Lock `descriptor` (output_dir's), waiting for another holder; False where the file system cannot lock it."""
    deadline, said = time.monotonic() + lock_wait_seconds(), False
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise RecipeError(
                    f"{source}: key 'output_dir': another run still writes into '{output_dir}' ({holder(output_dir)});"
                    " two runs in one folder would remove each other's checkpoints. Stop it (or wait for it to end) "
                    f"and rerun, or choose another output_dir. ({WAIT_ENV} sets how long a run waits for it.)"
                ) from None
            if not said:
                logger.warning("output_dir '%s' is in use by %s; waiting up to %.0f s for it to stop.",
                               output_dir, holder(output_dir), deadline - time.monotonic())
                said = True
            time.sleep(0.5)
        except OSError:
            return False


def release_output_dirs() -> None:
    """Drop every output_dir lock this process holds (its runs have ended; the kernel would drop them at exit too)."""
    while _held:
        os.close(_held.popitem()[1])  # closing the last descriptor of the open folder releases its flock

"""C++ extension build locks left by a killed build: cleared, so that a requeued run builds instead of hanging.

DeepSpeed builds its C++ ops on first use with torch's JIT (`torch.utils.cpp_extension.load`; on CPUs the shared
memory op `deepspeed_shm_comm` at every launch's first process group). One process of a machine builds in
`~/.cache/torch_extensions/<python>_<device>/<op>/` (or under `TORCH_EXTENSIONS_DIR`) while the file `lock` exists
there; the others wait for the file to go. A build killed half-way (a preemption whose grace time ran out, a node
that died, a second Ctrl-C) leaves the file behind, and every later launch on that cache waits for it forever
without a word: the requeued job of a preempted one hangs until its time limit.

`guard_extension_builds()` changes what a process does while it waits for such a lock:
- after `NOTICE_SECONDS` it logs one line naming the lock;
- on a preemption signal (`hf_sentcl.common.preemption`) it stops the run with `Preempted`: the wait is before the
  first step, so the last checkpoint is intact and the requeued run resumes from it;
- a lock whose build folder has not changed for `stale_seconds()` (a live build writes its ninja files and objects
  as it goes; a killed one writes nothing more) is removed with a warning, and this process builds the op itself.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from pathlib import Path

from hf_sentcl.common.preemption import Preempted, current_watch

logger = logging.getLogger("hf_sentcl")

#: seconds without any change in a build folder after which its lock counts as left by a killed build
STALE_ENV = "HF_SENTCL_STALE_BUILD_LOCK_S"
#: the default: far above the longest compile of one source file of DeepSpeed's ops (a live build writes each
#: object file when it is done), far below a job's time limit
DEFAULT_STALE_SECONDS = 600.0
#: seconds of waiting after which the wait is logged
NOTICE_SECONDS = 60.0
#: seconds between two looks at the build folder
CHECK_SECONDS = 5.0


class StaleBuildLock(RuntimeError):
    """A lock left by a killed build was removed; the build must start over (in this process)."""


def stale_seconds() -> float:
    """`HF_SENTCL_STALE_BUILD_LOCK_S` when set (ValueError naming it when it is not a positive number), else
    `DEFAULT_STALE_SECONDS`."""
    text = os.environ.get(STALE_ENV, "").strip()
    if not text:
        return DEFAULT_STALE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{STALE_ENV}={text!r}: give the seconds without any change in a C++ extension's build "
                         "folder after which its lock counts as left by a killed build, e.g. 600.")
    return value


def last_change(folder: Path) -> float:
    """The newest modification time (epoch seconds) of `folder` and the entries directly in it (where ninja and the
    compiler write); 0.0 when the folder is gone."""
    try:
        with os.scandir(folder) as entries:
            times = [entry.stat(follow_symlinks=False).st_mtime for entry in entries]
        return max([folder.stat().st_mtime, *times])
    except FileNotFoundError:
        return 0.0


def guarded_wait(baton) -> None:
    """`torch.utils.file_baton.FileBaton.wait` with the behaviour of the module docstring: returns when the lock is
    gone; raises `Preempted` on a preemption signal, `StaleBuildLock` after removing a stale lock."""
    lock = Path(baton.lock_file_path)
    stale = stale_seconds()
    started = time.monotonic()
    noticed, next_check = False, started
    while lock.exists():
        watch = current_watch()
        if watch.requested:
            raise Preempted(
                f"preempted by {watch.received.name} while waiting for the C++ extension build lock {lock}, before "
                "the first training step of this launch: rerun the same command (with 'resume_from_checkpoint: "
                "auto') to go on from the last complete checkpoint.", watch.received.name)
        now = time.monotonic()
        if not noticed and now - started >= NOTICE_SECONDS:
            noticed = True
            logger.warning("Waiting %.0f s so far for the C++ extension build lock %s: another process is building "
                           "that op, or a build killed half-way left the lock; it is removed once nothing in its "
                           "folder has changed for %.0f s (%s).", now - started, lock, stale, STALE_ENV)
        if now >= next_check:
            next_check = now + CHECK_SECONDS
            if remove_if_stale(lock, stale):
                raise StaleBuildLock(str(lock))
        time.sleep(baton.wait_seconds)


def remove_if_stale(lock: Path, stale: float) -> bool:
    """Remove `lock` when nothing in its folder changed for `stale` seconds; whether it was removed (by this call)."""
    try:
        seen = lock.stat()
    except FileNotFoundError:
        return False
    quiet = time.time() - last_change(lock.parent)
    if quiet < stale:
        return False
    try:
        if lock.stat().st_ino != seen.st_ino:  # another process replaced it meanwhile: a build has started
            return False
        lock.unlink()
    except FileNotFoundError:
        return False
    logger.warning("Removed the C++ extension build lock %s: nothing in its folder changed for %.0f s, so a build "
                   "killed half-way left it (a preempted or crashed run). This process builds the op now.",
                   lock, quiet)
    return True


def retrying_build(jit_compile, versioner):
    """`torch.utils.cpp_extension._jit_compile` that starts over once when its wait removed a stale lock: the lock
    is gone, so this process takes it and builds. `versioner`: torch's `JIT_EXTENSION_VERSIONER`, in which the
    first try recorded the sources as built; that record is undone, or the second try would skip the build."""

    @functools.wraps(jit_compile)
    def build(*args, **kwargs):
        name = args[0] if args else kwargs["name"]
        recorded = versioner.entries.get(name)
        try:
            return jit_compile(*args, **kwargs)
        except StaleBuildLock:
            if recorded is None:
                versioner.entries.pop(name, None)
            else:
                versioner.entries[name] = recorded
            return jit_compile(*args, **kwargs)

    build.hf_sentcl_guard = True
    return build


def guard_extension_builds() -> bool:
    """Install the guarded wait and the retrying build in torch (once per process); False when this torch has no
    `_jit_compile` to wrap (its wait is then left as it is)."""
    from torch.utils import cpp_extension, file_baton

    stale_seconds()  # a malformed setting is an error now, not in the middle of a launch
    jit_compile = getattr(cpp_extension, "_jit_compile", None)
    versioner = getattr(cpp_extension, "JIT_EXTENSION_VERSIONER", None)
    if jit_compile is None or not hasattr(versioner, "entries"):
        logger.debug("torch.utils.cpp_extension has no _jit_compile or versioner: build locks are not guarded.")
        return False
    if not getattr(jit_compile, "hf_sentcl_guard", False):
        cpp_extension._jit_compile = retrying_build(jit_compile, versioner)
        file_baton.FileBaton.wait = guarded_wait
    return True

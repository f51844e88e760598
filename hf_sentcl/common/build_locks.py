"""C++ extension build locks left by a killed build: cleared, so that a requeued run builds instead of hanging.

DeepSpeed builds its C++ ops on first use with torch's JIT (`torch.utils.cpp_extension.load`; on CPUs the shared
memory op `deepspeed_shm_comm` at every launch's first process group). One process of a machine builds in
`~/.cache/torch_extensions/<python>_<device>/<op>/` (or under `TORCH_EXTENSIONS_DIR`) while the file `lock` exists
there; the others wait for the file to go. A build killed half-way (a preemption whose grace time ran out, a node
that died, a second Ctrl-C) leaves the file behind, and every later launch on that cache waits for it forever
without a word: the requeued job of a preempted one hangs until its time limit.

`guard_extension_builds()` changes what a process does while it waits for such a lock:
- after `NOTICE_SECONDS` it logs one line naming the lock;
- a lock is stale when nothing in its build folder has changed for `stale_seconds()` (a live build writes its ninja
  files and each object file as it goes; a killed one writes nothing more) and no process of this machine is
  building there (ninja runs in the folder). A stale lock is removed with a warning and the op is built again by
  the waiting process; another process that saw it stale builds again too (ninja has nothing left to do then), so
  none loads a library the killed build never finished.

A preemption signal during the wait is noted as in any other setup work: the process waits on for the builder,
which keeps building, and the run stops at its first step boundary. Stopping the waiters at once would make the
launcher kill the builder half-way, which is what leaves such locks.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("hf_sentcl")

#: seconds without any change in a build folder after which its lock counts as left by a killed build
STALE_ENV = "HF_SENTCL_STALE_BUILD_LOCK_S"
#: the default: well above the compile time of one source file of DeepSpeed's ops (a live build writes each object
#: file when it is done; raise it for builds with longer single compiles), well below a job's time limit
DEFAULT_STALE_SECONDS = 600.0
#: seconds of waiting after which the wait is logged
NOTICE_SECONDS = 60.0
#: seconds between two looks at the build folder
CHECK_SECONDS = 5.0


class StaleBuildLock(RuntimeError):
    """A lock left by a killed build was removed (by this process or another): the build must start over."""

    def __init__(self, lock: Path):
        super().__init__(
            f"the C++ extension build lock {lock} was left by a killed build and removed, and the build started "
            f"over; it was left again. Delete the folder {lock.parent} and rerun the same command.")


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
    compiler write); an entry that vanishes while it is read (ninja deletes each object's dependency file) counts as
    a change now. 0.0 when the folder itself is gone."""
    try:
        newest = folder.stat().st_mtime
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                except FileNotFoundError:
                    return time.time()
        return newest
    except FileNotFoundError:
        return 0.0


def building_here(folder: Path) -> bool:
    """Whether a process of this machine has `folder` as its working directory (torch runs ninja there, and ninja
    the compiler). Processes of other users, which cannot be read, are not seen."""
    target = os.path.realpath(folder)
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/cwd") == target:
                    return True
            except OSError:
                continue
    return False


def quiet_seconds(lock: Path) -> float:
    """Seconds since anything changed in the lock's folder, or 0.0 while a process of this machine builds there."""
    return 0.0 if building_here(lock.parent) else time.time() - last_change(lock.parent)


def guarded_wait(baton: Any) -> None:
    """`torch.utils.file_baton.FileBaton.wait` with the behaviour of the module docstring: returns when the lock is
    gone; raises `StaleBuildLock` when it removed a stale lock, or when the lock went after it had looked stale
    (its remover is building again, and so must this process, or it would load what the killed build left)."""
    lock = Path(baton.lock_file_path)
    stale = stale_seconds()
    started = time.monotonic()
    noticed, next_check, looked_stale = False, started, False
    while lock.exists():
        now = time.monotonic()
        if not noticed and now - started >= NOTICE_SECONDS:
            noticed = True
            logger.warning("Waiting %.0f s so far for the C++ extension build lock %s: another process is building "
                           "that op, or a build killed half-way left the lock; it is removed once nothing in its "
                           "folder has changed for %.0f s (%s).", now - started, lock, stale, STALE_ENV)
        if now >= next_check:
            next_check = now + CHECK_SECONDS
            looked_stale = quiet_seconds(lock) >= stale
            if looked_stale and remove_if_stale(lock, stale):
                raise StaleBuildLock(lock)
        time.sleep(baton.wait_seconds)
    if looked_stale:
        raise StaleBuildLock(lock)


def remove_if_stale(lock: Path, stale: float) -> bool:
    """Remove `lock` when it is stale (see the module docstring); whether this call removed it. The check and the
    removal hold an exclusive lock on a file beside the build folder, and the lock file's identity must not change
    in between: a process that removed it and took it anew (to build) is not undone by another."""
    try:
        seen = lock.stat()
    except FileNotFoundError:
        return False
    identity = (seen.st_ino, seen.st_mtime_ns, seen.st_ctime_ns)
    clearing = lock.parent.parent / f".{lock.parent.name}.hf_sentcl-clearing"  # outside the folder it watches
    with open(clearing, "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            now, quiet = lock.stat(), quiet_seconds(lock)
            if (now.st_ino, now.st_mtime_ns, now.st_ctime_ns) != identity or quiet < stale:
                return False
            lock.unlink()
        except FileNotFoundError:
            return False
    logger.warning("Removed the C++ extension build lock %s: nothing in its folder changed for %.0f s and no process "
                   "here builds there, so a build killed half-way left it (a preempted or crashed run). This process "
                   "builds the op now.", lock, quiet)
    return True


def retrying_build(jit_compile: Callable, versioner: Any) -> Callable:
    """`torch.utils.cpp_extension._jit_compile` that starts over once when its wait met a stale lock: the lock is
    gone, so this process takes it and builds (or waits for the process that took it). `versioner`: torch's
    `JIT_EXTENSION_VERSIONER`, in which the first try recorded the sources as built; that record is undone, or the
    second try would skip the build."""

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
